# The two commands: `make demo` and `make test`. Each creates .venv and installs what it needs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)

# The shared Lambda layer, built without Docker for one architecture (docs/deploy.md).
# infra/components/layer.py must name the same architecture; synth checks .layer/ARCH.
LAYER_DIR      := .layer
LAYER_ARCH     := arm64
LAYER_PLATFORM := manylinux2014_aarch64
LAYER_PYTHON   := 3.12
LAYER_STAMP    := $(LAYER_DIR)/.deps-$(LAYER_ARCH)-$(shell cat pyproject.toml | sha256sum | cut -c1-12)

# The EMR Serverless job's bundle (infra/pipeline_bundle.py, docs/pipeline.md §7): third-party wheels for
# the job's platform, fetched without Docker like the layer's; re-installed only when the job's requirements
# (printed by the stdlib-only builder) or the builder change, not on every pyproject.toml edit.
EMR_DIR   := .emr
EMR_STAMP := $(EMR_DIR)/.deps-$(shell ($(PYTHON) -m infra.pipeline_bundle requirements 2>/dev/null || cat pyproject.toml) \
               | cat - infra/pipeline_bundle.py | sha256sum | cut -c1-12)

# The CDK CLI (Node), installed locally from npm; never committed.
CDK_CLI_DIR := .cdk-cli
CDK_CLI     := $(CDK_CLI_DIR)/node_modules/.bin/cdk
NODE_MAJOR  := $(shell node --version 2>/dev/null | sed 's/^v\([0-9]*\).*/\1/')
CDK_ENV     := JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION=1 JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION=$(NODE_MAJOR) \
               CDK_DISABLE_CLI_TELEMETRY=true

.PHONY: demo demo-small demo-full test install clean layer emr-bundle cdk-cli synth scan-tools scan ministack

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/lmctl demo

demo-small: $(STAMP)
	LM_DEMO_SCALE=small $(BIN)/lmctl demo

demo-full: $(STAMP)
	LM_DEMO_SCALE=full $(BIN)/lmctl demo

# Third-party wheels for the Lambda platform: re-installed only when pyproject.toml changes.
$(LAYER_STAMP): pyproject.toml | $(STAMP)
	rm -rf $(LAYER_DIR)
	mkdir -p $(LAYER_DIR)/python
	$(BIN)/python infra/layer_requirements.py > $(LAYER_DIR)/requirements.txt
	$(BIN)/python -m pip install --quiet --no-compile --platform $(LAYER_PLATFORM) --implementation cp \
		--python-version $(LAYER_PYTHON) --only-binary=:all: --target $(LAYER_DIR)/python \
		-r $(LAYER_DIR)/requirements.txt
	rm -rf $(LAYER_DIR)/python/bin
	find $(LAYER_DIR)/python -name __pycache__ -type d -prune -exec rm -rf {} +
	echo $(LAYER_ARCH) > $(LAYER_DIR)/ARCH
	touch $@

# The lightmetrics package is copied fresh every time (synth refuses a stale copy): what functions
# run of it, without the local runtime, CLI and harnesses (infra/layer_contents.py).
layer: $(LAYER_STAMP)
	$(BIN)/python -m infra.layer_contents $(LAYER_DIR)/python/lightmetrics

$(EMR_STAMP): | $(STAMP)
	rm -f $(EMR_DIR)/.deps-*
	$(BIN)/python -m infra.pipeline_bundle deps
	touch $@

# The code zip (lightmetrics + pipeline) is rebuilt whenever the sources differ (synth does the same).
emr-bundle: $(EMR_STAMP)
	$(BIN)/python -m infra.pipeline_bundle app

$(CDK_CLI):
	npm install --no-save --no-audit --no-fund --loglevel=error --prefix $(CDK_CLI_DIR) aws-cdk@2

cdk-cli: $(CDK_CLI)

# The security scanners, in a venv of their own (infra/scan-requirements.txt says why).
SCAN_VENV  := .venv-scan
SCAN_STAMP := $(SCAN_VENV)/.installed-$(shell cat infra/scan-requirements.txt | sha256sum | cut -c1-12)

$(SCAN_STAMP): infra/scan-requirements.txt
	test -x $(SCAN_VENV)/bin/python || $(PYTHON) -m venv $(SCAN_VENV)
	$(SCAN_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(SCAN_VENV)/bin/python -m pip install --quiet -r infra/scan-requirements.txt
	rm -f $(SCAN_VENV)/.installed-*
	touch $@

scan-tools: $(SCAN_STAMP)

# MiniStack, the suite's second AWS implementation, in a venv of its own (tests/ministack-requirements.txt says why).
MINISTACK_VENV  := .venv-ministack
MINISTACK_STAMP := $(MINISTACK_VENV)/.installed-$(shell cat tests/ministack-requirements.txt | sha256sum | cut -c1-12)

$(MINISTACK_STAMP): tests/ministack-requirements.txt
	test -x $(MINISTACK_VENV)/bin/python || $(PYTHON) -m venv $(MINISTACK_VENV)
	$(MINISTACK_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(MINISTACK_VENV)/bin/python -m pip install --quiet -r tests/ministack-requirements.txt
	rm -f $(MINISTACK_VENV)/.installed-*
	touch $@

ministack: $(MINISTACK_STAMP)

# checkov and cfn-lint on a fresh synth; skips and their reasons: .checkov.yaml, .cfnlintrc.yaml, infra/scanners.py.
scan: synth scan-tools
	$(BIN)/python -m infra.scanners cdk.out

synth: $(STAMP) layer emr-bundle cdk-cli
	$(CDK_ENV) $(CDK_CLI) synth --quiet

# pytest exits 5 when it collected no tests: that is a failure here, like any non-zero code.
# The simulation's bounded run and its mutant suite run beside it on the second core (tests/sim_support.py).
test: $(STAMP) layer emr-bundle cdk-cli scan-tools ministack
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) $(SCAN_VENV) $(MINISTACK_VENV) build *.egg-info .pytest_cache .hypothesis $(LAYER_DIR) $(EMR_DIR) $(CDK_CLI_DIR) cdk.out
