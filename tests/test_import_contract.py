"""The layers' import rules (issue 16), checked on the source: the folders of ``shared/lightmetrics``
are the architecture, and these rules keep them honest. The protocol core imports only itself;
nothing outside the adapters (``aws/``) and the composition root (``composition/``) imports boto3 or
botocore; the Lambda layer and the handlers never import the outer shells (the local runtime, the
CLI, the agent client, the harnesses, the operator tools, the pipeline); every import points down
the layers (protocol ← services ← composition ← Lambda shell and outer shells, :data:`LAYERS`); no
module imports another's private names. A short AST walk, no import is executed."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

from infra import layer_contents

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "shared" / "lightmetrics"
# The outer shells (what only operators, tests and benchmarks run) are what the layer leaves out:
# whole folders, one list, infra/layer_contents.py; and the pipeline, which no function runs.
OUTER_PATHS = set(layer_contents.OUTER_PACKAGES)
OUTER_MODULES = (*(f"lightmetrics.{p}" for p in sorted(OUTER_PATHS)), "lightmetrics_pipeline", "pipeline")
#: the adapters and the composition root: the only folders that may import boto3/botocore
BOTO_FOLDERS = {"aws", "composition"}
#: modules outside those folders that import boto3/botocore, each with its reason
BOTO_EXCEPTIONS = {
    "work/units.py": "classifies botocore's transport and client errors as transient (run_unit retries, never "
                   "blocks on them); it imports the exception classes only, never builds a client",
}
#: the services: what the protocol is for, reaching storage, queues and executions through ports
SERVICE_FOLDERS = ("work", "jobs", "acceptance", "derived", "reaps", "admin")
#: adapter names a service still imports, (module, "adapter module.name") -> why
ADAPTER_EXCEPTIONS = {
    **{("work/units.py", f"lightmetrics.aws.errors.{n}"): "run_unit classifies botocore's errors (transient or a "
       "refusal) for every service; see BOTO_EXCEPTIONS" for n in ("describe", "is_transient")},
}
#: imports of the protocol core from outside it, each with its reason (none: the ports are pure)
PROTOCOL_EXCEPTIONS: dict[tuple[str, str], str] = {}
#: The layers, lowest first: a module imports its own layer's modules and those of the layers below,
#: never above. protocol ← services ← composition ← Lambda shell and outer shells; the adapters and the
#: deployment's spec stand on the protocol only, and within the services the work runtime is the
#: lowest, the job kernel of the walk and the reaps on it, and the operator side (admin/) the highest. Every folder of the package is in one layer.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("protocol",),
    ("aws", "deployment"),
    ("work",),
    ("jobs",),
    ("acceptance",),
    ("derived",),
    ("reaps",),
    ("admin",),
    ("composition",),
    ("lambda_shell",),
    tuple(sorted(OUTER_PATHS)),
)
#: upward imports still left, (module, imported module) -> why (none: keep it that way)
LAYER_EXCEPTIONS: dict[tuple[str, str], str] = {}


def imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(module, imported names, relative level) of every import statement in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.append((node.module, [a.name for a in node.names], node.level))
        elif isinstance(node, ast.Import):
            out.extend((a.name, [], 0) for a in node.names)
    return out


def is_outer(module: str) -> bool:
    return any(module == o or module.startswith(o + ".") for o in OUTER_MODULES)


def inner_modules() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if p.relative_to(PACKAGE).parts[0] not in OUTER_PATHS]


def rel(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def test_the_package_root_holds_folders_only() -> None:
    """The layout is the architecture: every module lives in the folder of its role."""
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert loose == []
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert {"protocol", "work", "jobs", "acceptance", "derived", "reaps", "admin", "aws", "composition", "lambda_shell"} <= folders
    assert folders == {f for layer in LAYERS for f in layer}, "every folder is in one layer"


def layer_of(module: str) -> int | None:
    """The index in :data:`LAYERS` of a ``lightmetrics.<folder>...`` module (None for anything else)."""
    parts = module.split(".")
    if parts[0] != "lightmetrics" or len(parts) < 2:
        return None
    return next((i for i, layer in enumerate(LAYERS) if parts[1] in layer), None)


def imported_modules(path: Path) -> list[str]:
    """The modules ``path`` imports (``from lightmetrics import aws`` as ``lightmetrics.aws``)."""
    return [f"{m}.{n}" if m == "lightmetrics" else m for m, names, _ in imports(path) for n in (names or [""])]


def upward_imports() -> list[str]:
    """Every import of a module from a higher layer, as ``<module> imports <imported>``."""
    found = []
    for p in sorted(PACKAGE.rglob("*.py")):
        own = layer_of("lightmetrics." + ".".join(p.relative_to(PACKAGE).parts))
        for m in sorted(set(imported_modules(p))):
            theirs = layer_of(m)
            if own is not None and theirs is not None and theirs > own and (rel(p), m) not in LAYER_EXCEPTIONS:
                found.append(f"{rel(p)} imports {m}")
    return found


def test_every_import_points_down_the_layers() -> None:
    """Issue 25: the tree is the architecture. Services never import the composition root or the
    Lambda shell (the handler factories live in lambda_shell/); the work runtime imports no other
    service; the operator side is imported by nothing in the layer below the composition root."""
    assert upward_imports() == []
    stale = [k for k in LAYER_EXCEPTIONS if k[1] not in imported_modules(PACKAGE / k[0])]
    assert stale == [], "an exception no longer needed"


def test_the_protocol_core_imports_only_itself() -> None:
    """protocol/ is pure: no boto3/botocore, no service, no adapter (docs/protocol.md is its spec)."""
    core = sorted((PACKAGE / "protocol").glob("*.py"))
    assert len(core) > 8
    found = [f"{rel(p)} imports {m}" for p in core for m, _, _ in imports(p)
             if (m.split(".")[0] in ("boto3", "botocore") or m.startswith("lightmetrics")
                 and not m.startswith("lightmetrics.protocol")) and (rel(p), m) not in PROTOCOL_EXCEPTIONS]
    assert found == []


def adapter_imports(path: Path) -> list[str]:
    """Every ``lightmetrics.aws`` name ``path`` imports, as ``module.name`` (a module import as itself)."""
    out = []
    for m, names, _ in imports(path):
        if m == "lightmetrics" and "aws" in names:
            out.append("lightmetrics.aws")
        elif m == "lightmetrics.aws" or m.startswith("lightmetrics.aws."):
            out.extend([f"{m}.{n}" for n in names] or [m])
    return out


def test_services_import_no_adapter() -> None:
    """Issue 16: services reach the adapters only through ports (protocol/), wired by the composition
    root; what is left is listed with its reason, and a listed import that went fails too."""
    services = [p for folder in SERVICE_FOLDERS for p in sorted((PACKAGE / folder).rglob("*.py"))]
    assert len(services) > 30
    found = [f"{rel(p)} imports {name}" for p in services for name in adapter_imports(p)
             if (rel(p), name) not in ADAPTER_EXCEPTIONS]
    assert found == []
    stale = [k for k in ADAPTER_EXCEPTIONS if k[1] not in adapter_imports(PACKAGE / k[0])]
    assert stale == [], "an exception no longer needed"


def test_only_the_adapters_and_the_composition_root_import_boto3() -> None:
    """Services reach AWS through the adapters in aws/, wired by composition/; the handlers too."""
    modules = [p for p in inner_modules() if p.relative_to(PACKAGE).parts[0] not in BOTO_FOLDERS]
    found = [f"{rel(p)} imports {m}" for p in modules for m, _, _ in imports(p)
             if m.split(".")[0] in ("boto3", "botocore") and rel(p) not in BOTO_EXCEPTIONS]
    found += [f"{p.relative_to(ROOT)} imports {m}" for p in sorted((ROOT / "functions").rglob("*.py"))
              for m, _, _ in imports(p) if m.split(".")[0] in ("boto3", "botocore")]
    assert found == []
    stale = [f for f in BOTO_EXCEPTIONS
             if not any(m.split(".")[0] in ("boto3", "botocore") for m, _, _ in imports(PACKAGE / f))]
    assert stale == [], "an exception no longer needed"


def test_every_package_is_installed_under_a_lightmetrics_name() -> None:
    """Issue 16 item 8: no generic top-level names (``functions``, ``pipeline``) in site-packages, and the
    explicit package list of pyproject.toml names every folder (setuptools' find cannot rename one)."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    folders = {"lightmetrics." + ".".join(p.parent.relative_to(PACKAGE).parts) for p in PACKAGE.rglob("__init__.py")}
    folders = {f.rstrip(".") for f in folders}
    folders |= {".".join(("lightmetrics_pipeline", *p.parent.relative_to(ROOT / "pipeline").parts))
                for p in (ROOT / "pipeline").rglob("__init__.py")}
    assert listed == folders
    assert setuptools["package-dir"] == {"lightmetrics": "shared/lightmetrics", "lightmetrics_pipeline": "pipeline"}


def test_the_layer_core_never_imports_an_outer_shell() -> None:
    found = [f"{p.relative_to(ROOT)} imports {m}" for p in inner_modules() for m, _, _ in imports(p) if is_outer(m)]
    assert found == []


def test_handlers_import_only_the_layer() -> None:
    found = [f"{p.relative_to(ROOT)} imports {m}" for p in sorted((ROOT / "functions").rglob("*.py"))
             for m, _, _ in imports(p) if is_outer(m)]
    assert found == []


def test_no_module_imports_another_modules_private_names() -> None:
    found = [f"{p.relative_to(ROOT)}: from {m} import {n}"
             for base in (PACKAGE, ROOT / "pipeline", ROOT / "functions", ROOT / "infra")
             for p in sorted(base.rglob("*.py")) for m, names, level in imports(p) if level == 0
             for n in names if n.startswith("_") and not n.startswith("__")]
    assert found == []


def client_reach_throughs(path: Path) -> list[int]:
    """Lines where ``<x>.store.client``/``<x>.table.client`` (or ``store.client``) is used: a
    service reaching past the port to the boto3 client behind it."""
    return [node.lineno for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Attribute) and node.attr == "client"
            and ((isinstance(node.value, ast.Attribute) and node.value.attr in ("store", "table"))
                 or (isinstance(node.value, ast.Name) and node.value.id in ("store", "table")))]


def test_services_reach_storage_only_through_the_ports() -> None:
    """Issue 16: the object store and control table ports are complete, so no service in the layer
    reaches through them to the boto3 client (listing, versions, deletes and ranged reads are port
    operations), and nothing asks the type checker to look away (``type: ignore[attr-defined]``)."""
    services = [p for p in inner_modules() if p.relative_to(PACKAGE).parts[0] not in BOTO_FOLDERS]
    found = [f"{p.relative_to(ROOT)}:{line}" for p in services for line in client_reach_throughs(p)]
    assert found == []
    ignored = [f"{p.relative_to(ROOT)}:{n}" for p in services
               for n, text in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if "ignore[attr-defined]" in text]
    assert ignored == []


def test_functions_keep_their_state_one_way() -> None:
    """Issue 16: every function builds what it keeps per container with
    :class:`lightmetrics.lambda_shell.per_container.PerContainer` — no ``global`` rebinding, no state dicts."""
    found = []
    for p in sorted((ROOT / "functions").rglob("*.py")):
        tree = ast.parse(p.read_text(encoding="utf-8"))
        found += [f"{p.relative_to(ROOT)}:{n.lineno} global" for n in ast.walk(tree) if isinstance(n, ast.Global)]
        found += [f"{p.relative_to(ROOT)}:{n.lineno} state dict" for n in tree.body
                  if isinstance(n, (ast.Assign, ast.AnnAssign)) and isinstance(n.value, ast.Dict)]
    assert found == []


def test_the_job_packages_name_their_modules() -> None:
    """The reap's and the walk's package docstrings are their table of contents: every module of the
    package has its line (a name in double backquotes), and every name there is a module."""
    import re

    for package in (PACKAGE / "reaps", PACKAGE / "derived" / "walk"):
        doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
        named = set(re.findall(r"^``(\w+)`` +", doc, re.M))
        modules = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
        assert modules - named == set(), f"{package.name}: modules its docstring does not name"
        assert named - modules == set(), f"{package.name}: names in its docstring that are not modules"


def test_the_rules_see_what_they_forbid(tmp_path: Path) -> None:
    """The walk is not vacuous: a planted violation of each kind is found."""
    bad = tmp_path / "bad.py"
    bad.write_text("from lightmetrics.local.server import LocalRuntime\nfrom lightmetrics.cli.ops_cmds import _who\n"
                   "from lightmetrics_pipeline.audit.job import run_audit\nfrom lightmetrics.harness.demo import run_demo\n")
    found = imports(bad)
    assert sum(is_outer(m) for m, _, _ in found) == 4
    assert any(n.startswith("_") for _, names, _ in found for n in names)
    assert len(inner_modules()) > 40
    bad.write_text("def f():\n    import boto3\n    from botocore.exceptions import ClientError\n")
    assert [m for m, _, _ in imports(bad)] == ["boto3", "botocore.exceptions"]
    bad.write_text("from lightmetrics.aws.control_table import ControlTable\nfrom lightmetrics import aws\n"
                   "import lightmetrics.aws.s3_store\n")
    assert adapter_imports(bad) == ["lightmetrics.aws.control_table.ControlTable", "lightmetrics.aws",
                                    "lightmetrics.aws.s3_store"]
    bad.write_text("def f(ctx):\n    return ctx.store.client.get_object(Bucket='b', Key='k')\n")
    assert client_reach_throughs(bad) == [2]
    bad.write_text("from lightmetrics.composition.services import work_context\nfrom lightmetrics import admin\n")
    assert [layer_of(m) for m in imported_modules(bad)] == [LAYERS.index(("composition",)), LAYERS.index(("admin",))]
    assert layer_of("lightmetrics.work.units") < layer_of("lightmetrics.derived.indexing") < layer_of("lightmetrics.local")
