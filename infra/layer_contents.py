"""What of ``shared/lightmetrics`` the Lambda layer ships: everything a function runs, nothing more.

The outer shells — whole folders: ``local/`` (the local runtime), ``cli/``, ``client/`` (the agent
client) and ``harness/`` (demo, soak, ledger, benchmarks, test switches) — stay out: no function
imports them (``tests/test_import_contract.py``), and the layer-only sandbox test runs every handler with
exactly this copy. ``make layer`` copies with :func:`copy_shared_package`; synth refuses a layer
whose copy differs (:func:`differences`).

Example:
    >>> "cli/main.py" in {str(p) for p in shipped()}, "harness/demo.py" in {str(p) for p in shipped()}
    (False, False)
    >>> "aws/s3_store.py" in {str(p) for p in shipped()}
    True

Run as ``python -m infra.layer_contents DEST`` to (re)write the copy at ``DEST``.
"""

from __future__ import annotations

import filecmp
import shutil
import sys
from pathlib import Path

SHARED_PACKAGE = Path(__file__).resolve().parents[1] / "shared" / "lightmetrics"

#: Folders of ``lightmetrics`` the layer leaves out: the outer shells (the local runtime, the CLI, the
#: agent client, and the harnesses — demo, soak, ledger, benchmarks, test switches).
OUTER_PACKAGES = ("local", "cli", "client", "harness")
#: Modules of the core that only operators' tools and synth use, never a function (``lmctl verify``
#: and its invariant catalogue, ``cost``, ``conflicts show``, ``env --stack``; the state machines'
#: definitions are rendered at synth and by the local runtime; the roles' statements are granted at synth
#: and by the local runtime), relative to the package. A test keeps this list equal to what no
#: function reaches.
OPERATOR_MODULES = (
    "derived/audit_watermarks.py",
    "derived/verify.py",
    "derived/verify_report.py",
    "deployment/cost_model.py",
    "deployment/cost_workload.py",
    "deployment/policies.py",
    "deployment/stack_outputs.py",
    "deployment/statemachines.py",
    "ops/identity_view.py",
    "protocol/invariants.py",
)


def _files(root: Path) -> list[Path]:
    return sorted(p.relative_to(root) for p in root.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")


def is_outer(rel: Path) -> bool:
    """Whether a path relative to the package belongs to an outer shell."""
    return rel.parts[0] in OUTER_PACKAGES


def shipped(src: Path = SHARED_PACKAGE) -> list[Path]:
    """The files of ``src`` the layer ships, relative to it."""
    return [rel for rel in _files(src) if not is_outer(rel) and rel.as_posix() not in OPERATOR_MODULES]


def differences(dest: Path, src: Path = SHARED_PACKAGE) -> list[str]:
    """Relative paths where the copy at ``dest`` is not exactly :func:`shipped` (missing, changed
    or extra files)."""
    want = shipped(src)
    out = [str(rel) for rel in want if not (dest / rel).is_file() or not filecmp.cmp(src / rel, dest / rel, shallow=False)]
    extra = set(_files(dest)) - set(want) if dest.is_dir() else set()
    return out + sorted(str(rel) for rel in extra)


def copy_shared_package(dest: Path, src: Path = SHARED_PACKAGE) -> None:
    """Write the shipped files of ``src`` to ``dest`` (replacing whatever was there)."""
    shutil.rmtree(dest, ignore_errors=True)
    for rel in shipped(src):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, dest / rel)


if __name__ == "__main__":
    copy_shared_package(Path(sys.argv[1]))
