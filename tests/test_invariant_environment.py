"""Issue 13, area "environment": what the deployed code may assume about the world it runs in.

* 10 — a missing bucket, table or queue, or access denied, is an error (exit 2 naming it), never "empty".
* 12 — deployed functions import only what the layer ships (a sandbox with nothing else on sys.path).
* 13 — production code has no test switches (faults, latency, clock offsets come from the host only).
* 14 — configuration enforces the protocol's timing assumptions (H1, D1), refused at start.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
import tomllib
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from lightmetrics.local.system import LocalSystem

ROOT = Path(__file__).resolve().parents[1]
EVENTS = ROOT / "events"
SAMPLE_BUCKET = "lightmetrics-local"  # the bucket named in the committed sample events
_NS = 1_000_000_000


@pytest.fixture(scope="module")
def system(runtime):  # type: ignore[no-untyped-def]
    tag = uuid.uuid4().hex[:10]
    return LocalSystem(runtime, bucket=f"lm-env-{tag}", table=f"lm-env-{tag}", secret_name=f"lm-env/{tag}",
                       queue_name_prefix=f"env{tag}-").provision()


def lmctl(system: LocalSystem, *args: str, **env: str) -> tuple[int, dict[str, Any]]:
    """``lmctl ARGS --json`` in this process (the same code path as the console script)."""
    from lightmetrics.cli.main import cli

    result = CliRunner().invoke(cli, [*args, "--json"], env={**system.environment(), **env}, catch_exceptions=True)
    try:
        return result.exit_code, json.loads(result.stdout)  # stdout is the one JSON document; progress goes to stderr
    except ValueError:
        return result.exit_code, {"output": result.output, "exception": repr(result.exception)}


# ============================================================================ property 10


def test_property_10_the_store_raises_for_a_missing_bucket_and_answers_none_for_a_missing_key(runtime, bucket):  # type: ignore[no-untyped-def]
    from lightmetrics.aws.s3_store import S3ObjectStore, s3_client_config
    from lightmetrics.harness.testing.faults import FaultInjector, FaultRule
    from lightmetrics.protocol.errors import ResourceAccessError

    client = runtime.boto3_client("s3", config=s3_client_config())
    missing = f"lm-missing-{uuid.uuid4().hex[:8]}"
    gone = S3ObjectStore(client, missing)
    for name, call in {"list_page": lambda: gone.list_page("accepted/v1/"),
                       "list_keys": lambda: gone.list_keys("accepted/v1/"),
                       "list_modified": lambda: gone.list_modified("accepted/v1/"),
                       "get": lambda: gone.get("accepted/v1/x.json"),
                       "require_bucket": lambda: gone.require_bucket("accepted/v1/")}.items():
        with pytest.raises(ResourceAccessError) as err:
            call()
        assert missing in str(err.value) and "LM_BUCKET" in str(err.value), name
        assert err.value.resource == f"bucket {missing}"
    present = S3ObjectStore(client, bucket)
    assert present.get("accepted/v1/none.json") is None  # a missing key stays a 404
    assert present.head("accepted/v1/none.json") is None
    assert present.list_keys("accepted/v1/") == []  # an existing, empty prefix is empty
    FaultInjector(client).add(FaultRule(fault="403", operation="ListObjectsV2", times=-1))
    with pytest.raises(ResourceAccessError, match=f"bucket {bucket} \\(LM_BUCKET\\) refused ListObjectsV2 accepted/v1/: 403 AccessDenied"):
        present.list_keys("accepted/v1/")


def test_property_10_the_control_table_and_queues_raise_for_a_missing_resource(runtime):  # type: ignore[no-untyped-def]
    from botocore.exceptions import ClientError

    from lightmetrics.aws.control_table import ControlTable
    from lightmetrics.aws.sqs_queues import queue_depth
    from lightmetrics.protocol.errors import ResourceAccessError

    missing = f"lm-missing-{uuid.uuid4().hex[:8]}"
    table = ControlTable(runtime.boto3_client("dynamodb"), missing)
    for name, call in {"get": lambda: table.get("checkpoint#reconcile", "current"),
                       "query": lambda: table.query("blockers"),
                       "put": lambda: table.put({"pk": "a", "sk": "b"}),
                       "update": lambda: table.update("a", "b", "SET x = :x", values={":x": 1}),
                       "delete": lambda: table.delete("a", "b")}.items():
        with pytest.raises(ResourceAccessError) as err:
            call()
        assert missing in str(err.value) and "LM_TABLE" in str(err.value), name

    class Denied:  # DynamoDB's answer to a role without the table in its policy
        def get_item(self, **_: Any) -> Any:
            raise ClientError({"Error": {"Code": "AccessDeniedException", "Message": "not authorized"},
                               "ResponseMetadata": {"HTTPStatusCode": 400}}, "GetItem")

    with pytest.raises(ResourceAccessError, match=f"table {missing} \\(LM_TABLE\\) refused access"):
        ControlTable(Denied(), missing).get("a", "b")

    bogus = f"{runtime.endpoint_url}/123456789012/{missing}"
    with pytest.raises(ResourceAccessError) as err:
        queue_depth(runtime.boto3_client("sqs"), bogus)
    assert missing in str(err.value) and "LM_QUEUE_URLS" in str(err.value)


SURFACES = {
    "verify": ["verify"],
    "walk start": ["walk", "start"],
    "reconcile run": ["reconcile"],
    "reap start": ["reap", "gc"],
    "status": ["status"],
}


@pytest.mark.parametrize("surface", sorted(SURFACES))
def test_property_10_every_operator_surface_exits_2_naming_a_missing_bucket(system, runtime, surface):  # type: ignore[no-untyped-def]
    missing = f"lm-missing-{uuid.uuid4().hex[:8]}"
    sfn = runtime.boto3_client("stepfunctions")
    before = {name: len(sfn.list_executions(stateMachineArn=arn)["executions"])
              for name, arn in system.settings.state_machine_arns.items()}
    code, out = lmctl(system, *SURFACES[surface], "--bucket", missing)
    assert code == 2, (surface, out)
    assert missing in out["reason"] and "LM_BUCKET" in out["reason"], out
    after = {name: len(sfn.list_executions(stateMachineArn=arn)["executions"])
             for name, arn in system.settings.state_machine_arns.items()}
    assert after == before, "nothing is started against a bucket that does not exist"


@pytest.mark.parametrize("surface", sorted(SURFACES))
def test_property_10_every_operator_surface_exits_2_naming_a_missing_table(system, surface):  # type: ignore[no-untyped-def]
    missing = f"lm-missing-{uuid.uuid4().hex[:8]}"
    code, out = lmctl(system, "--table", missing, *SURFACES[surface])  # given on lmctl itself (issue 17)
    assert code == 2, (surface, out)
    assert missing in out["reason"] and "LM_TABLE" in out["reason"], out


@pytest.mark.parametrize("surface", ["status", "reconcile run"])
def test_property_10_status_and_the_reconciler_exit_2_naming_a_missing_queue(system, runtime, surface):  # type: ignore[no-untyped-def]
    missing = f"lm-missing-{uuid.uuid4().hex[:8]}"
    # first, so the reconciler's "are the index queues quiet" probe reads it before any other
    urls = {"index-accepted": f"{runtime.endpoint_url}/123456789012/{missing}", **{
        n: u for n, u in system.settings.queue_urls.items() if n != "index-accepted"}}
    code, out = lmctl(system, *SURFACES[surface], "--queue-urls", json.dumps(urls))
    assert code == 2, (surface, out)
    assert missing in out["reason"] and "LM_QUEUE_URLS" in out["reason"], out


def test_property_10_walk_and_reap_tasks_fail_on_a_missing_bucket_instead_of_finding_nothing(runtime):  # type: ignore[no-untyped-def]
    """What a console start of the state machines (no CLI check first) meets: the task that lists
    fails, so the walk ends failed without a watermark and the reap ends without a proof."""
    from lightmetrics.derived.walk import Walker, read_watermarks
    from lightmetrics.protocol.errors import ResourceAccessError
    from lightmetrics.reaps import Reaper

    tag = uuid.uuid4().hex[:10]
    system = LocalSystem(runtime, bucket=f"lm-gone-{tag}", table=f"lm-gone-{tag}", secret_name=f"lm-gone/{tag}",
                         queue_name_prefix=f"gone{tag}-").provision()
    runtime.boto3_client("s3").delete_bucket(Bucket=system.bucket)  # empty, so S3 lets it go
    ctx = system.work_context()
    walker = Walker(ctx, system.settings)
    begun = walker.begin({"input": {}, "execution_arn": "console", "state_machine_arn": "console"})
    with pytest.raises(ResourceAccessError, match=system.bucket):
        walker.plan({"walk": begun["walk"]})
    walker.end({"walk": begun["walk"], "outcome": "failed", "error": {"Error": "StoreAccessError"}})  # the ASL's Abort
    assert set(read_watermarks(ctx.table).values()) == {None}
    reaper = Reaper(ctx, system.settings)
    with pytest.raises(ResourceAccessError, match=system.bucket):
        step = reaper.begin({"input": {"mode": "gc", "dry_run": True}, "execution_arn": "console"})
        reaper.gc({"reap": step["reap"]})


@pytest.mark.parametrize("control", ["walk", "reap gc", "reap retention"])
def test_property_10_walk_and_reap_controls_refuse_a_missing_bucket_before_starting(system, runtime, control):  # type: ignore[no-untyped-def]
    """The bucket check is in ``WalkControl.start`` / ``ReapControl.start`` (not only in lmctl), so
    every caller of them is refused before an execution starts."""
    from dataclasses import replace

    from lightmetrics.aws.s3_store import S3ObjectStore, s3_client_config
    from lightmetrics.composition.services import executions
    from lightmetrics.derived.walk import WalkControl
    from lightmetrics.protocol.errors import ResourceAccessError
    from lightmetrics.reaps import ReapControl

    missing = f"lm-missing-{uuid.uuid4().hex[:8]}"
    ctx = system.work_context()
    ctx = replace(ctx, store=S3ObjectStore(runtime.boto3_client("s3", config=s3_client_config()), missing))
    sfn = runtime.boto3_client("stepfunctions")
    name = "bootstrap-walk" if control == "walk" else "reap"
    arn = system.state_machine_arn(name)
    before = len(sfn.list_executions(stateMachineArn=arn)["executions"])
    with pytest.raises(ResourceAccessError, match=missing):
        if control == "walk":
            WalkControl(ctx, executions(sfn), arn).start(timeout_s=10)
        else:
            ReapControl(ctx, executions(sfn), arn).start(mode=control.split()[1], dry_run=True, timeout_s=10)
    assert len(sfn.list_executions(stateMachineArn=arn)["executions"]) == before, "nothing started"


def test_property_10_pipeline_listings_raise_for_a_missing_bucket(runtime):  # type: ignore[no-untyped-def]
    from lightmetrics.protocol.errors import ResourceAccessError
    from lightmetrics_pipeline import s3io
    from lightmetrics_pipeline.inventory import report as inventory

    missing = f"lm-missing-{uuid.uuid4().hex[:8]}"
    access = s3io.S3Access(bucket=missing, endpoint_url=runtime.endpoint_url, region="us-east-1",
                           access_key="testing", secret_key="testing", max_attempts=1)
    calls = {
        "s3io.list_all": lambda: s3io.list_all(access, "accepted/v1/"),
        "inventory.listing_rows": lambda: list(inventory.listing_rows(s3io.client(access), missing, "accepted/v1/")),
        "inventory.open_report": lambda: inventory.open_report(f"s3://{missing}/inventory/", access),
        "inventory.snapshot": lambda: inventory.snapshot(access, inventory.Destination.parse(f"s3://{missing}/inv")),
    }
    for name, call in calls.items():
        with pytest.raises(ResourceAccessError) as err:
            call()
        assert missing in str(err.value), name


# ============================================================================ property 12 (and the sandbox of 13)

#: Never part of the layer: the operator CLI, the local runtime and the Spark jobs bring these.
NOT_SHIPPED = ("moto", "werkzeug", "click", "rich", "pyspark")


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def layer_distributions() -> dict[str, Any]:
    """``[project].dependencies`` and everything they require, with their extras (what ``make
    layer`` pip-installs), resolved against this interpreter's installed metadata."""
    from importlib import metadata

    from packaging.requirements import Requirement

    wanted = [Requirement(d) for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]
    found: dict[str, Any] = {}
    extras_of: dict[str, set[str]] = {}
    while wanted:
        req = wanted.pop()
        key = _canonical(req.name)
        extras = set(req.extras)
        if key in found and extras <= extras_of[key]:
            continue
        extras_of[key] = extras_of.get(key, set()) | extras
        dist = found.setdefault(key, metadata.distribution(req.name))
        for raw in dist.requires or []:
            sub = Requirement(raw)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in extras_of[key] | {""}):
                wanted.append(sub)
    return found


def top_level_entries(dist: Any) -> set[str]:
    """The top-level packages/modules a distribution installs (from its RECORD)."""
    out = set()
    for f in dist.files or []:
        top = f.parts[0]
        if top.endswith((".dist-info", ".egg-info", ".data")) or top in ("..", "__pycache__", "bin"):
            continue
        if len(f.parts) == 1 and not top.endswith((".py", ".so", ".pth")):
            continue
        if top.endswith(".pth"):
            continue
        out.add(top)
    return out


def build_layer_sandbox(directory: Path) -> Path:
    """A directory holding only the layer: the runtime dependencies' top-level packages, ``lightmetrics``
    as ``make layer`` copies it (infra.layer_contents: without the outer shells) and ``functions``
    (each function's code asset)."""
    from infra.layer_contents import copy_shared_package

    directory.mkdir(parents=True, exist_ok=True)
    for dist in layer_distributions().values():
        for top in top_level_entries(dist):
            target = Path(dist.locate_file(top))
            if target.exists() and not (directory / top).exists():
                (directory / top).symlink_to(target)
    copy_shared_package(directory / "lightmetrics")
    (directory / "functions").symlink_to(ROOT / "functions")
    return directory


def run_in_layer(tmp_path: Path, plan: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    sandbox = build_layer_sandbox(tmp_path / "layer")
    plan_path, result_path = tmp_path / "plan.json", tmp_path / "result.json"
    plan_path.write_text(json.dumps({**plan, "sandbox": str(sandbox), "absent": list(NOT_SHIPPED)}))
    child_env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"), **env}
    r = subprocess.run([sys.executable, "-I", "-S", str(ROOT / "tests" / "layer_only_invoke.py"), str(plan_path),
                        str(result_path)], capture_output=True, text=True, env=child_env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(result_path.read_text())


def _event(path: str, bucket: str) -> Any:
    return json.loads((EVENTS / path).read_text().replace(SAMPLE_BUCKET, bucket))


def _admin_event(method: str, path: str, query: dict[str, str] | None = None) -> dict[str, Any]:
    event = json.loads((EVENTS / "admin" / "list-unresolved-conflicts.json").read_text())
    event.update(rawPath=path, rawQueryString="&".join(f"{k}={v}" for k, v in (query or {}).items()),
                 queryStringParameters=query or None)
    event["requestContext"]["http"].update(method=method, path=path)
    return event


def sample_keys_secret(system: LocalSystem, runtime: Any) -> None:
    """The system's token secret holds the sample keys, so the committed ingest events authenticate."""
    secret = json.loads((EVENTS / "ingest" / "secret.json").read_text())
    secret.pop("_comment")
    runtime.boto3_client("secretsmanager").put_secret_value(SecretId=system.secret_name, SecretString=json.dumps(secret))


def layer_env(system: LocalSystem) -> dict[str, str]:
    from lightmetrics.harness.testing import sample_events

    return {**system.environment(), "LM_MAX_FRAME_BYTES": str(sample_events.SAMPLE_MAX_FRAME_BYTES)}


def test_property_12_deployed_functions_import_only_what_the_layer_ships(system, runtime, tmp_path):  # type: ignore[no-untyped-def]
    from lightmetrics.deployment.resources import SPEC

    sample_keys_secret(system, runtime)
    bucket = system.bucket
    index = json.loads((EVENTS / "ingest" / "index.json").read_text())
    calls = [{"module": "functions.ingest.app", "label": e["event"], "event": _event(f"ingest/{e['event']}", bucket)}
             for e in index]
    for function in ("index_accepted", "index_raw_blobs", "index_quarantine", "reconcile", "sweep_dlq"):
        for path in sorted((EVENTS / function).glob("*.json")):
            calls.append({"module": f"functions.{function}.app", "label": path.name,
                          "event": _event(f"{function}/{path.name}", bucket)})
    admin = {"list": _event("admin/list-unresolved-conflicts.json", bucket), "routes": [
        {"label": "GET /conflicts/<id>", "event": _admin_event("GET", "/conflicts/REPLACE-WITH-CONFLICT-ID")},
        {"label": "POST /conflicts/<id>/resolve", "event": _event("admin/resolve-accept-existing.json", bucket)},
        {"label": "GET /denylist", "event": _admin_event("GET", "/denylist")},
        {"label": "GET /blockers", "event": _admin_event("GET", "/blockers", {"all": "true"})},
        {"label": "GET /status", "event": _admin_event("GET", "/status")},
    ]}
    walk_arn = system.state_machine_arn("bootstrap-walk")
    walk_input = json.loads((EVENTS / "statemachines" / "bootstrap-walk-scheduled.json").read_text())
    plan = {
        "calls": calls,
        "admin": admin,
        # a walk to its Finish; then one key per page and one round per execution, so Continue runs
        # too (it starts the next execution on the local runtime, which finishes that walk)
        "walks": [{"input": {**walk_input, **extra}, "state_machine_arn": walk_arn,
                   "execution_arn": walk_arn.replace(":stateMachine:", ":execution:") + f":sandbox-{n}"}
                  for n, extra in enumerate([{}, {"page_size": 1, "max_rounds_per_execution": 1}])],
        # the last one continues after its first task (Continue starts the next execution)
        "reaps": [json.loads((EVENTS / "statemachines" / "reap-gc-dry-run.json").read_text()),
                  {"mode": "retention", "dry_run": True},
                  {"mode": "gc", "dry_run": True, "source": "scan", "page_size": 1, "max_tasks_per_execution": 1}],
        "reap_execution_arn": system.state_machine_arn("reap").replace(":stateMachine:", ":execution:") + ":sandbox",
        "reap_state_machine_arn": system.state_machine_arn("reap"),
    }
    out = run_in_layer(tmp_path, plan, layer_env(system))

    assert out["importable"] == {name: False for name in NOT_SHIPPED}, "the sandbox must not see the CLI's packages"
    failed = [(r["module"], r["label"], r.get("error"), r.get("traceback")) for r in out["results"] if not r["ok"]]
    assert not failed, failed
    called = {r["module"] for r in out["results"]}
    assert called == {s.module for s in SPEC.functions}, "every deployed function is imported and called"
    by_label = {(r["module"], r["label"]): r["result"] for r in out["results"]}
    for entry in index:  # ingest: each sample event gets its documented answer
        answer = by_label[("functions.ingest.app", entry["event"])]
        assert (answer["statusCode"], json.loads(answer["body"])["status"]) == (entry["status_code"], entry["status"])
    admin_answers = {label: r for (module, label), r in by_label.items() if module == "functions.admin.app"}
    assert {label: a["statusCode"] for label, a in admin_answers.items()} == {
        "GET /conflicts": 200, "GET /conflicts/<id>": 200, "POST /conflicts/<id>/resolve": 200,
        "GET /denylist": 200, "GET /blockers": 200, "GET /status": 200}
    for (module, label), r in by_label.items():
        if module.startswith("functions.index_"):
            assert r == {"batchItemFailures": []}, (module, label, r)
    sfn = runtime.boto3_client("stepfunctions")
    deadline = time.monotonic() + 120
    while sfn.list_executions(stateMachineArn=walk_arn, statusFilter="RUNNING")["executions"]:
        assert time.monotonic() < deadline, "the continued walk did not finish"
        time.sleep(0.2)


@pytest.fixture
def fresh_system(runtime):  # type: ignore[no-untyped-def]
    tag = uuid.uuid4().hex[:10]
    return LocalSystem(runtime, bucket=f"lm-sw-{tag}", table=f"lm-sw-{tag}", secret_name=f"lm-sw/{tag}",
                       queue_name_prefix=f"sw{tag}-").provision()


def _module_file(name: str) -> Path | None:
    base = ROOT / "shared" if name.split(".")[0] == "lightmetrics" else ROOT
    path = base.joinpath(*name.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def deployed_closure() -> dict[str, ast.Module]:
    """Every first-party module reachable by imports (anywhere in a module, lazy ones too) from
    functions/*/app.py, with its syntax tree; third-party imports are recorded under ``None`` keys."""
    todo = [f"functions.{p.parent.name}.app" for p in sorted((ROOT / "functions").glob("*/app.py"))]
    seen: dict[str, ast.Module] = {}
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = _module_file(name)
        if path is None:
            continue
        tree = ast.parse(path.read_text(), str(path))
        seen[name] = tree
        parts = name.split(".")
        for parent in range(1, len(parts)):
            todo.append(".".join(parts[:parent]))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                todo.extend(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                todo.append(node.module)
                todo.extend(f"{node.module}.{a.name}" for a in node.names)
    return seen


def third_party_imports(closure: dict[str, ast.Module]) -> set[str]:
    out = set()
    for tree in closure.values():
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
            for n in names:
                top = n.split(".")[0]
                if top not in ("lightmetrics", "functions", "__future__") and top not in sys.stdlib_module_names:
                    out.add(top)
    return out


def test_property_12_every_import_a_deployed_function_can_reach_is_in_the_layer() -> None:
    """The static side of the sandbox test: lazy imports on paths no sample event takes count too."""
    shipped = {top.removesuffix(".py").split(".")[0] for d in layer_distributions().values() for top in top_level_entries(d)}
    closure = deployed_closure()
    assert "lightmetrics.admin.status" in closure and "lightmetrics.reaps" in closure  # the walk reaches lazy imports
    missing = third_party_imports(closure) - shipped
    assert not missing, f"deployed code imports packages the layer does not ship: {sorted(missing)}"
    local = sorted(m for m in closure if m.startswith(("lightmetrics.local", "lightmetrics.cli", "lightmetrics.harness.bench")))
    assert not local, f"deployed code reaches the local runtime / CLI: {local}"


def test_property_12_the_layer_ships_exactly_what_functions_reach() -> None:
    """Issue 16: the layer's lightmetrics modules are the deployed functions' import closure — no
    local runtime, CLI, harness or operator-only module rides along, and nothing they reach is left out."""
    from infra.layer_contents import shipped

    modules = {"lightmetrics." + ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
               for rel in shipped() if rel.suffix == ".py"}
    modules = {m.removesuffix(".__init__") for m in modules}
    reached = {m for m in deployed_closure() if m == "lightmetrics" or m.startswith("lightmetrics.")}
    assert modules == reached, (sorted(modules - reached), sorted(reached - modules))


# ============================================================================ property 13

TEST_SWITCHES = ("LM_FAULTS", "LM_CLOCK_OFFSET_S", "LM_INJECT_LATENCY_MS", "LM_INJECT_MAX_INFLIGHT", "LM_CRASH_AT")


def test_property_13_no_module_a_deployed_function_reaches_imports_test_code_or_reads_a_test_switch() -> None:
    closure = deployed_closure()
    testing = sorted(m for m in closure if m.startswith("lightmetrics.harness.testing"))
    assert not testing, f"deployed code imports test code: {testing}"
    reads = sorted((name, node.value) for name, tree in closure.items() for node in ast.walk(tree)
                   if isinstance(node, ast.Constant) and node.value in TEST_SWITCHES)
    assert not reads, f"deployed code names a test switch: {reads}"
    hooks = sorted((name, node.attr if isinstance(node, ast.Attribute) else node.id)
                   for name, tree in closure.items() for node in ast.walk(tree)
                   if (isinstance(node, ast.Attribute) and node.attr in ("install", "hosted"))
                   or (isinstance(node, ast.Name) and node.id in ("install", "hosted")))
    assert not hooks, f"deployed code installs a host of its own: {hooks}"


def test_property_13_a_deployed_handler_ignores_test_switches_in_its_environment(fresh_system, runtime, tmp_path):  # type: ignore[no-untyped-def]
    system = fresh_system
    sample_keys_secret(system, runtime)
    offset_s = 400 * 86400
    env = {**layer_env(system),
           "LM_FAULTS": json.dumps([{"fault": "503", "operation": "PutObject", "times": -1}]),
           "LM_CLOCK_OFFSET_S": str(offset_s), "LM_INJECT_LATENCY_MS": "300", "LM_INJECT_MAX_INFLIGHT": "1",
           "LM_CRASH_AT": "gc.proved"}
    accepted = _event("ingest/rotated-key-previous-key.json", system.bucket)
    plan = {"calls": [{"module": "functions.ingest.app", "label": "accepted", "event": accepted}],
            "reaps": [{"mode": "gc", "dry_run": True}],
            "reap_execution_arn": system.state_machine_arn("reap").replace(":stateMachine:", ":execution:") + ":sw"}
    started = time.time_ns()
    out = run_in_layer(tmp_path, plan, env)
    failed = [(r["module"], r["label"], r.get("error")) for r in out["results"] if not r["ok"]]
    assert not failed, failed
    answer = out["results"][0]["result"]
    assert (answer["statusCode"], json.loads(answer["body"])["status"]) == (200, "accepted"), "LM_FAULTS injected"
    record = json.loads(runtime.boto3_client("s3").get_object(
        Bucket=system.bucket, Key=json.loads(answer["body"])["manifest_key"])["Body"].read())
    assert abs(record["accepted_at_unix_ns"] - started) < 120 * _NS, "the ingest clock is not the real clock"
    report = out["results"][-1]["result"]
    assert abs(int(report["started_at_ns"]) - started) < 120 * _NS, "LM_CLOCK_OFFSET_S shifted the reap's clock"
    assert not [m for m in out["modules"] if m.startswith(("lightmetrics.harness.testing", "lightmetrics.local"))], out["modules"]


def test_property_13_the_local_runtime_is_what_injects_the_switches_into_what_it_hosts(bucket, monkeypatch):  # type: ignore[no-untyped-def]
    """The features the demo, the soak and the benchmarks rely on, now supplied by the host."""
    from lightmetrics.composition.services import accept_context, work_context
    from lightmetrics.deployment.settings import Settings
    from lightmetrics.local.server import LocalRuntime
    from lightmetrics.protocol import hosting

    monkeypatch.setenv("LM_CLOCK_OFFSET_S", "600")
    monkeypatch.setenv("LM_FAULTS", json.dumps([{"fault": "503", "operation": "PutObject", "times": -1}]))
    before = hosting.current()
    rt = LocalRuntime(port=0).start()  # a process that runs the local runtime becomes its functions' host
    try:
        host = hosting.current()
        assert host is not before and not host.timing_rules and host.s3_client_hooks
        settings = Settings.from_env({}, bucket=bucket)
        assert work_context(settings).clock.now_ns() - time.time_ns() > 590 * _NS
        client = accept_context(settings).store.client  # type: ignore[attr-defined]
        with pytest.raises(Exception, match="SlowDown"):
            client.put_object(Bucket=bucket, Key="k", Body=b"x")
    finally:
        rt.stop()
    assert hosting.current() is before  # stopping it gives the process its host back


# ============================================================================ property 14
# Settings read at start under the deployed host (AWS: the only host a function has). This test
# process runs a local runtime, whose host allows short waits, so the deployed one is explicit.


def test_property_14_gc_grace_must_exceed_the_longest_accept_plus_clock_skew() -> None:
    from lightmetrics.deployment.resources import SPEC
    from lightmetrics.deployment.settings import Settings
    from lightmetrics.deployment.timeouts import longest_accept_s, longest_reap_task_s
    from lightmetrics.local.hosting import host_from_env
    from lightmetrics.protocol.errors import ConfigError
    from lightmetrics.protocol.hosting import DEPLOYED, hosted
    from lightmetrics.protocol.timing import DEFAULT_CLOCK_SKEW_S

    assert longest_accept_s() == SPEC.function("ingest").timeout_s
    bound = longest_accept_s() + DEFAULT_CLOCK_SKEW_S
    base = {"LM_BUCKET": "b-1"}
    with hosted(DEPLOYED):
        with pytest.raises(ConfigError) as err:
            Settings.from_env({**base, "LM_GC_GRACE_S": str(bound)})
        assert "H1" in str(err.value) and "LM_GC_GRACE_S" in str(err.value) and "LM_CLOCK_SKEW_S" in str(err.value)
        # H2: the grace also outlasts the longest reap task (plus the lease margin)
        reap_bound = longest_reap_task_s()
        assert reap_bound > bound
        with pytest.raises(ConfigError, match="H2"):
            Settings.from_env({**base, "LM_GC_GRACE_S": str(reap_bound - 1)})
        assert Settings.from_env({**base, "LM_GC_GRACE_S": str(reap_bound)}).gc_grace_s == reap_bound
        # the skew allowance is a setting: a large one moves H1's bound past H2's
        with pytest.raises(ConfigError, match="H1"):
            Settings.from_env({**base, "LM_GC_GRACE_S": str(reap_bound), "LM_CLOCK_SKEW_S": str(reap_bound)})
        assert Settings.from_env({**base, "LM_GC_GRACE_S": str(longest_accept_s() + reap_bound + 1),
                                  "LM_CLOCK_SKEW_S": str(reap_bound)})
    with pytest.raises(ValueError, match="H1"):  # constructed directly (the CDK app): always enforced
        Settings(bucket="b-1", gc_grace_s=bound)
    with hosted(host_from_env({})):  # only a local host may run a zero grace (the interleaving tests do)
        assert Settings.from_env({**base, "LM_GC_GRACE_S": "0"}).gc_grace_s == 0


def test_property_14_a_deployed_function_refuses_to_start_with_a_violating_configuration(system, monkeypatch):  # type: ignore[no-untyped-def]
    from functions.reconcile import app as reconcile_app
    from lightmetrics.local.function_host import LambdaContext
    from lightmetrics.protocol.errors import ConfigError
    from lightmetrics.protocol.hosting import DEPLOYED, hosted

    for name, value in system.environment().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LM_GC_GRACE_S", "30")
    reconcile_app.reset()
    try:
        with hosted(DEPLOYED), pytest.raises(ConfigError, match="LM_GC_GRACE_S"):
            reconcile_app.handler({}, LambdaContext("reconcile"))
    finally:
        reconcile_app.reset()


def test_property_14_tombstone_wait_must_exceed_the_writers_tombstone_cache() -> None:
    from lightmetrics.local.hosting import host_from_env
    from lightmetrics.protocol.errors import ConfigError
    from lightmetrics.protocol.hosting import DEPLOYED, hosted
    from lightmetrics.protocol.timing import TOMBSTONE_CACHE_S, check_tombstone_wait
    from lightmetrics.protocol.tombstones import TombstoneCache

    assert TombstoneCache(None, None).ttl_s == TOMBSTONE_CACHE_S  # the rule and the cache share one number
    with hosted(DEPLOYED):
        for bad in (0, TOMBSTONE_CACHE_S - 1, TOMBSTONE_CACHE_S):
            with pytest.raises(ConfigError) as err:
                check_tombstone_wait(bad)
            assert "tombstone_wait_s" in str(err.value) and "D1" in str(err.value)
        assert check_tombstone_wait(TOMBSTONE_CACHE_S + 1) == TOMBSTONE_CACHE_S + 1
    with hosted(host_from_env({})):
        assert check_tombstone_wait(0) == 0


def test_property_14_a_reap_input_with_a_short_tombstone_wait_is_refused_at_begin() -> None:
    from lightmetrics.protocol.hosting import DEPLOYED, hosted
    from lightmetrics.protocol.timing import TOMBSTONE_CACHE_S
    from lightmetrics.reaps import InvalidReapInput, ReapParams

    base = {"mode": "retention", "dry_run": False}
    with hosted(DEPLOYED):
        with pytest.raises(InvalidReapInput, match="D1"):
            ReapParams.parse({**base, "tombstone_wait_s": TOMBSTONE_CACHE_S})
        assert ReapParams.parse(base).tombstone_wait_s > TOMBSTONE_CACHE_S  # the default obeys the rule
        assert ReapParams.parse({**base, "tombstone_wait_s": TOMBSTONE_CACHE_S + 1}).tombstone_wait_s == 61
