"""Security scanners (checkov, cfn-lint) over a synthesized cloud assembly, and the stack's per-resource skips.

Class-wide decisions live in ``.checkov.yaml`` and ``.cfnlintrc.yaml`` at the repository root, one
reason per skip. A decision about one resource is a ``checkov`` skip in that resource's Metadata,
added by :func:`apply_checkov_skips`, so the check still holds for every other resource (a second
Function URL without auth would be reported). The scanners live in ``.venv-scan`` (``make
scan-tools``): checkov pins boto3 and networkx below what the project needs.

    $ make scan                            # synth into cdk.out, then both scanners
    $ .venv/bin/python -m infra.scanners cdk.out
    checkov: 0 failed, 470 passed, 4 skipped (per resource)
    cfn-lint: no findings
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra.config import ROOT

if TYPE_CHECKING:  # the runner below needs no CDK (importing it starts a Node process)
    from aws_cdk import CfnResource

    from infra.stack import LightmetricsStack

SCAN_BIN = ROOT / ".venv-scan" / "bin"
CHECKOV_CONFIG = ROOT / ".checkov.yaml"
CFN_LINT_CONFIG = ROOT / ".cfnlintrc.yaml"


#: Functions whose URL has no AWS auth on purpose; another gets checkov's CKV_AWS_258 until reviewed.
UNAUTHENTICATED_URL_FUNCTIONS = ("ingest",)


def _cfn(construct: Any) -> "CfnResource":
    from aws_cdk import CfnResource

    cfn = construct.node.default_child
    assert isinstance(cfn, CfnResource), construct.node.path
    return cfn


def checkov_skips_for(stack: "LightmetricsStack") -> list[tuple["CfnResource", str, str]]:
    """The per-resource exceptions as (resource, check, reason); class-wide ones are in ``.checkov.yaml``."""
    from aws_cdk import aws_sns as sns

    out = []
    for name in UNAUTHENTICATED_URL_FUNCTIONS:
        url = stack.functions.built[name].url
        if url is not None:
            out.append((_cfn(url), "CKV_AWS_258",
                        "Agents are not AWS principals: ingest checks each request's HMAC bearer token "
                        "(docs/protocol.md §7) before any S3 request; reserved concurrency bounds what others cost"))
    ops = _cfn(stack.storage.ops_bucket)
    out.append((ops, "CKV_AWS_18", "This bucket is where the authority bucket's access logs go; logging it "
                                   "would take a third bucket for logs about logs"))
    out.append((ops, "CKV_AWS_21", "Inventory reports and access logs are regenerated or append-only and "
                                   "expire by lifecycle; versions would only keep expired copies"))
    if isinstance(stack.observability.topic, sns.Topic):  # not when an existing topic is imported
        out.append((_cfn(stack.observability.topic), "CKV_AWS_26",
                    "Alarm notifications carry alarm names and states only; CloudWatch cannot publish to a "
                    "topic under the AWS-managed aws/sns key, so SSE would need a customer-managed key"))
    return out


def apply_checkov_skips(stack: "LightmetricsStack") -> None:
    """Write each resource's skips into its Metadata: ``checkov: {skip: [{id, comment}, ...]}``."""
    by_path: dict[str, tuple[CfnResource, list[dict[str, str]]]] = {}
    for resource, check, reason in checkov_skips_for(stack):
        by_path.setdefault(resource.node.path, (resource, []))[1].append({"id": check, "comment": reason})
    for resource, skips in by_path.values():
        resource.add_metadata("checkov", {"skip": skips})


# --------------------------------------------------------------------------- running the scanners


def templates(outdir: Path) -> list[Path]:
    """Every CloudFormation template of a cloud assembly (the stack's and its nested stacks')."""
    found = sorted(Path(outdir).resolve().glob("*.template.json"))
    if not found:
        raise FileNotFoundError(f"no *.template.json in {outdir}: synthesize first (make synth)")
    return found


def missing_tools() -> list[str]:
    return [tool for tool in ("checkov", "cfn-lint") if not (SCAN_BIN / tool).exists()]


def checkov_command(outdir: Path, config: Path = CHECKOV_CONFIG) -> list[str]:
    """checkov on the templates only (asset directories hold the layer's code, not infrastructure).

    ``--quiet``: the JSON report lists failed checks only (and counts the rest); checkov 3.3 cannot
    serialize some passed graph checks (CKV2_AWS_75 on a function with a URL) to JSON.
    """
    files = [arg for t in templates(outdir) for arg in ("--file", str(t))]
    return [str(SCAN_BIN / "checkov"), "--config-file", str(config), "--quiet", "--output", "json", *files]


def cfn_lint_command(outdir: Path, config: Path = CFN_LINT_CONFIG) -> list[str]:
    return [str(SCAN_BIN / "cfn-lint"), "--config-file", str(config), "--format", "parseable", "--",
            *map(str, templates(outdir))]


def run_all(commands: Mapping[str, list[str]], cwd: Path, timeout_s: float = 300) -> dict[str, subprocess.CompletedProcess[str]]:
    """Run the commands at the same time (each scanner is single-threaded); their results by name.

    ``cwd`` must hold no scanner config: both scanners also read one found in their working directory,
    on top of ``--config-file``. The cloud assembly's directory is a good one.
    """
    procs = {name: subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, cmd in commands.items()}  # fmt: skip
    done = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=timeout_s)
        done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return done


def checkov_report(run: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """checkov's JSON report (one object for one framework), or an error saying what it printed instead."""
    try:
        report = json.loads(run.stdout)
    except json.JSONDecodeError:
        raise RuntimeError(f"checkov printed no JSON report (exit {run.returncode}): {run.stderr[-2000:]}") from None
    if isinstance(report, list):
        (report,) = report
    return report


#: The key of each config's skip list.
SKIP_KEYS = {CHECKOV_CONFIG.name: "skip-check", CFN_LINT_CONFIG.name: "ignore_checks"}


def _lines(config: Path) -> list[tuple[str, bool]]:
    """The config's lines, each with whether it belongs to the skip list (a top-level YAML list)."""
    out, in_list = [], False
    for line in config.read_text().splitlines():
        if not line.startswith((" ", "-", "#")) and line.strip():
            in_list = line.split(":", 1)[0].strip() == SKIP_KEYS[config.name]
        out.append((line, in_list))
    return out


def config_skips(config: Path) -> dict[str, str]:
    """A scanner config's skip list as check -> reason (the comment on the item's line).

        >>> config_skips(CFN_LINT_CONFIG)["W3005"][:9]
        'CDK adds '
    """
    skips: dict[str, str] = {}
    for line, in_list in _lines(config):
        item = line.strip()
        if in_list and item.startswith("- "):
            check, _, reason = item[2:].partition("#")
            skips[check.strip()] = reason.strip()
    return skips


def without_skips(config: Path, tmp: Path) -> Path:
    """A copy of ``config`` in ``tmp`` without its skip list (to see what the skips hide)."""
    copy = tmp / config.name
    copy.write_text("".join(line + "\n" for line, in_list in _lines(config) if not in_list))
    return copy


def main(argv: list[str]) -> int:
    outdir = Path(argv[0] if argv else "cdk.out").resolve()
    missing = missing_tools()
    if missing:
        print(f"{', '.join(missing)} not installed: run `make scan-tools`", file=sys.stderr)
        return 2
    runs = run_all({"checkov": checkov_command(outdir), "cfn-lint": cfn_lint_command(outdir)}, cwd=outdir)
    report = checkov_report(runs["checkov"])
    failed = report["results"]["failed_checks"]
    for f in failed:
        print(f"checkov: {f['check_id']} {f['resource']} ({Path(f['file_path']).name}): {f['check_name']}")
    s = report["summary"]
    print(f"checkov: {s['failed']} failed, {s['passed']} passed, {s['skipped']} skipped (per resource)")
    lint = runs["cfn-lint"]
    print(lint.stdout.rstrip() or "cfn-lint: no findings")
    if lint.stderr:
        print(lint.stderr.rstrip(), file=sys.stderr)
    return 1 if failed or runs["checkov"].returncode or lint.returncode else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
