"""The key layout lives in one module: ``lightmetrics.protocol.keys`` (the :class:`KeyCodec` and its
prefix table), and the v2 derived layout in ``lightmetrics.protocol.segment_keys`` (its ``V2_ROOTS``).
Everywhere else a layout root (``accepted/v1/``, ``rollup/v1/``, ...) is asked of the codec
(``codec.root(kind)``, ``layout_root(kind)``, the hour/window prefix builders), never spelled, so a
change of the layout is a change of one file. Checked on the source: every string constant of
every module (docstrings and comments may keep naming prefixes: they explain, they do not build keys).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from lightmetrics.protocol.keys import LAYOUT_ROOTS
from lightmetrics.protocol.segment_keys import V2_ROOTS

ROOT = Path(__file__).resolve().parents[1]
#: where the system's code lives (the tests may spell keys: they check the codec from outside)
SOURCE_DIRS = ("shared/lightmetrics", "pipeline", "functions", "infra")
HOME = "shared/lightmetrics/protocol/keys.py"
V2_HOME = "shared/lightmetrics/protocol/segment_keys.py"
#: modules that may still spell layout roots, each with its reason (none now: keep it that way)
ALLOWED: dict[str, str] = {}
#: a layout root not preceded by another key character ("x-accepted/v1/" is not "accepted/v1/")
ROOTS = (*LAYOUT_ROOTS, *V2_ROOTS.values())
LITERAL = re.compile(r"(?<![A-Za-z0-9_.=-])(?:" + "|".join(re.escape(r) for r in ROOTS) + ")")


def docstring_nodes(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (module, class, function)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def layout_literals(source: str) -> list[tuple[int, str]]:
    """(line, text) of every non-docstring string constant of ``source`` that spells a layout root
    (f-string parts included: they are constants of the f-string)."""
    tree = ast.parse(source)
    docs = docstring_nodes(tree)
    return sorted((node.lineno, node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
                  and LITERAL.search(node.value))


def offenders(root: Path) -> dict[str, list[tuple[int, str]]]:
    found = {}
    for folder in SOURCE_DIRS:
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel in (HOME, V2_HOME) or rel in ALLOWED or "/node_modules/" in rel or "cdk.out" in rel:
                continue
            hits = layout_literals(path.read_text(encoding="utf-8"))
            if hits:
                found[rel] = hits
    return found


def test_the_detector_finds_what_it_must_and_nothing_else() -> None:
    spelled = 'def f(codec):\n    """Lists ``accepted/v1/``."""\n    return codec.prefix + "accepted/v1/"\n'
    assert layout_literals(spelled) == [(3, "accepted/v1/")]
    assert layout_literals('x = f"{p}rollup/v1/window={w}/"\n') == [(1, "rollup/v1/window=")]
    assert layout_literals('x = "my-rollup/v1/"\n') == []  # part of another name: not a root
    assert layout_literals('x = "prod/accepted-by-time/v1/"\n') == [(1, "prod/accepted-by-time/v1/")]
    assert layout_literals("x = codec.root(KeyKind.ACCEPTED)  # accepted/v1/\n") == []  # comments explain


def test_no_module_but_the_key_codec_spells_a_layout_root() -> None:
    assert len(LAYOUT_ROOTS) == 13
    assert (ROOT / HOME).is_file() and layout_literals((ROOT / HOME).read_text())  # the codec does spell them
    assert layout_literals((ROOT / V2_HOME).read_text())
    assert layout_literals('x = "accepted-by-time/v2/"\n') == [(1, "accepted-by-time/v2/")]
    assert offenders(ROOT) == {}


def test_the_allow_list_names_existing_modules_that_still_need_it() -> None:
    """An entry goes when its module no longer spells a root (or is gone)."""
    stale = [rel for rel in ALLOWED
             if not (ROOT / rel).is_file() or not layout_literals((ROOT / rel).read_text(encoding="utf-8"))]
    assert stale == []
