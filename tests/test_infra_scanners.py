"""Security scanners (checkov, cfn-lint) on the session's one synth (``cdk_synth``), and cdk.json's feature flags.

Both scanners run as ``make scan`` runs them (``infra.scanners``), from ``.venv-scan`` (``make scan-tools``;
``make test`` installs it). Each also runs once without its class-wide skips, so a skip that no longer
matches anything is reported as stale. The four runs start together: about 17 s of CPU, 10 s on two idle cores.
"""

from __future__ import annotations

import json
import re
import sys
import tarfile
import types
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: The aws-cdk-lib release whose recommended flags cdk.json carries; a newer one may recommend others.
FLAGS_ALIGNED_WITH = "2.275.0"


@pytest.fixture(scope="module")
def scans(cdk_synth: Any, tmp_path_factory: pytest.TempPathFactory) -> types.SimpleNamespace:
    from infra import scanners

    missing = scanners.missing_tools()
    if missing:
        pytest.fail(f"{', '.join(missing)} not installed: run `make scan-tools` (make test does it)")
    outdir = Path(cdk_synth.outdir)
    bare = tmp_path_factory.mktemp("scan-configs")
    runs = scanners.run_all(
        {
            "checkov": scanners.checkov_command(outdir),
            "cfn-lint": scanners.cfn_lint_command(outdir),
            "checkov-unskipped": scanners.checkov_command(outdir, scanners.without_skips(scanners.CHECKOV_CONFIG, bare)),
            "cfn-lint-unskipped": scanners.cfn_lint_command(outdir, scanners.without_skips(scanners.CFN_LINT_CONFIG, bare)),
        },
        cwd=outdir,
    )
    return types.SimpleNamespace(
        runs=runs,
        checkov=scanners.checkov_report(runs["checkov"]),
        checkov_unskipped=scanners.checkov_report(runs["checkov-unskipped"]),
        templates=scanners.templates(outdir),
    )


def _failed(report: dict[str, Any]) -> list[str]:
    return sorted(f"{f['check_id']} {f['resource']}" for f in report["results"]["failed_checks"])


def test_checkov_finds_nothing_unsuppressed(scans: Any) -> None:
    summary = scans.checkov["summary"]
    # Every resource of every template was read: the main stack's and the pipeline's nested one.
    assert len(scans.templates) >= 2 and summary["parsing_errors"] == 0
    assert summary["resource_count"] == sum(len(json.loads(t.read_text())["Resources"]) for t in scans.templates)
    assert summary["passed"] > 100
    assert _failed(scans.checkov) == [], "unsuppressed checkov findings (fix them, or skip with a reason)"
    assert scans.runs["checkov"].returncode == 0, scans.runs["checkov"].stderr[-2000:]


def test_cfn_lint_finds_nothing_unsuppressed(scans: Any) -> None:
    run = scans.runs["cfn-lint"]
    assert (run.returncode, run.stdout.strip()) == (0, ""), run.stdout[-3000:] + run.stderr[-2000:]


def test_every_class_wide_skip_has_a_reason_and_still_matches(scans: Any) -> None:
    from infra import scanners

    checkov_skips = scanners.config_skips(scanners.CHECKOV_CONFIG)
    lint_skips = scanners.config_skips(scanners.CFN_LINT_CONFIG)
    assert checkov_skips and lint_skips
    for check, reason in {**checkov_skips, **lint_skips}.items():
        assert len(reason) > 20, f"{check}: a skip needs a one-line reason"
    # Without the skips, each skipped check fails somewhere (else the skip is stale: remove it).
    unskipped = {f.split()[0] for f in _failed(scans.checkov_unskipped)}
    assert set(checkov_skips) <= unskipped, f"stale checkov skips: {sorted(set(checkov_skips) - unskipped)}"
    lint_out = scans.runs["cfn-lint-unskipped"].stdout
    lint_found = set(re.findall(r":([EWI]\d{4}):", lint_out))
    assert set(lint_skips) <= lint_found, f"stale cfn-lint ignores: {sorted(set(lint_skips) - lint_found)}"
    # ... and nothing else fails without them: the class-wide skips are the only difference.
    assert unskipped <= set(checkov_skips)
    assert lint_found <= set(lint_skips)


def test_per_resource_skips_have_reasons_and_only_the_ingest_url_is_unauthenticated(scans: Any, cdk_synth: Any) -> None:
    skips = {(k, s["id"]): s["comment"] for t in scans.templates for k, r in json.loads(t.read_text())["Resources"].items()
             for s in r.get("Metadata", {}).get("checkov", {}).get("skip", [])}  # fmt: skip
    assert skips and all(len(reason) > 20 for reason in skips.values())
    assert scans.checkov["summary"]["skipped"] == len(skips)  # checkov read every one of them
    # CKV_AWS_258 (Function URL without auth) is skipped for ingest's URL only, and only there is it NONE:
    # any other URL without auth would be reported.
    urls = {k: r["Properties"]["AuthType"] for k, r in cdk_synth.json["Resources"].items() if r["Type"] == "AWS::Lambda::Url"}
    ingest_url = cdk_synth.stack.resolve(cdk_synth.stack.functions.built["ingest"].url.node.default_child.logical_id)
    assert {k for k, check in skips if check == "CKV_AWS_258"} == {ingest_url}
    assert {k for k, auth in urls.items() if auth == "NONE"} == {ingest_url} and len(urls) > 1
    from infra import scanners

    assert "CKV_AWS_258" not in scanners.config_skips(scanners.CHECKOV_CONFIG)


def unbounded_logs(template: dict[str, Any]) -> list[str]:
    """Functions and state machines whose logs go to no log group of the template with a retention."""
    res = template["Resources"]
    kept = {k for k, r in res.items() if r["Type"] == "AWS::Logs::LogGroup" and r["Properties"].get("RetentionInDays")}
    out = []
    for k, r in res.items():
        p = r.get("Properties", {})
        if r["Type"] == "AWS::Lambda::Function":
            target = p.get("LoggingConfig", {}).get("LogGroup", {}).get("Ref")
        elif r["Type"] == "AWS::StepFunctions::StateMachine":
            dests = p.get("LoggingConfiguration", {}).get("Destinations", [{}])
            target = dests[0].get("CloudWatchLogsLogGroup", {}).get("LogGroupArn", {}).get("Fn::GetAtt", [None])[0]
        else:
            continue
        if target not in kept:
            out.append(k)
    return out


def test_every_function_and_state_machine_logs_with_retention(scans: Any) -> None:
    # CDK's bucket-notifications handler included: without a group of its own, Lambda makes one that never expires.
    found = {t.name: unbounded_logs(json.loads(t.read_text())) for t in scans.templates}
    assert {name: ks for name, ks in found.items() if ks} == {}
    (main,) = [json.loads(t.read_text()) for t in scans.templates if not t.name.endswith(".nested.template.json")]
    assert any(k.startswith("BucketNotificationsHandler") for k in main["Resources"])


# --------------------------------------------------------------------------- cdk.json feature flags


def _recommended_flags() -> tuple[str, dict[str, Any]]:
    """The installed aws-cdk-lib's version and its recommended feature flags (what `cdk init` writes)."""
    import aws_cdk

    version = metadata.version("aws-cdk-lib")
    (tgz,) = Path(aws_cdk.__file__).parent.joinpath("_jsii").glob("aws-cdk-lib@*.jsii.tgz")
    with tarfile.open(tgz) as tar:
        member = tar.extractfile("package/recommended-feature-flags.json")
        assert member is not None
        return version, json.load(member)


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", v)[:3])


def test_cdk_json_carries_the_recommended_feature_flags() -> None:
    from infra.config import cdk_json_context

    version, recommended = _recommended_flags()
    context = cdk_json_context()
    wrong = {k: (context[k], v) for k, v in recommended.items() if k in context and context[k] != v}
    assert wrong == {}, "flags set against the recommendation (cdk.json value, recommended)"
    missing = sorted(set(recommended) - set(context))
    stray = sorted(k for k in context if k.startswith("@aws-cdk") and k not in recommended)
    if _version(version) > _version(FLAGS_ALIGNED_WITH) and (missing or stray):
        # pyproject allows a newer aws-cdk-lib than cdk.json was aligned with: say so, don't fail.
        pytest.skip(f"aws-cdk-lib {version} (cdk.json aligned with {FLAGS_ALIGNED_WITH}): "
                    f"recommended but missing {missing}, no longer recommended {stray}")
    assert missing == [], "recommended flags missing from cdk.json"
    assert stray == [], "feature flags in cdk.json that aws-cdk-lib does not recommend"
