"""docs/protocol-map.md equals docs/protocol.md and the code (issue 25 item 5).

The protocol states what must hold and names rules by id (``D5``, ``G-I8``, ...); the map says
where each rule lives: its section, the modules that implement it, the tests that check it, and
the settings, constants and metrics behind the parameters and signals the protocol names. A
module or test that moves makes this test fail naming the stale path; a rule added to (or dropped
from) the protocol without its row fails too; and a citation ``§N <rule>`` anywhere in the
repository must name the section that defines the rule.
"""

from __future__ import annotations

import importlib
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROTOCOL = ROOT / "docs" / "protocol.md"
MAP = ROOT / "docs" / "protocol-map.md"
MAX_LINE = 110

#: A rule id: ``D5``, ``O1a``, ``CW2``, ``G-I8``, ``R-I5``, ``RR3``, ``DR1``.
RULE = r"(?:[A-Z]{1,2}|[A-Z]-[A-Z])\d+[a-z]?"
#: Where protocol.md defines a rule: a list item that begins with it (``* **D5 ...``, ``* C6 —``)
#: or the first cell of a table row (``| I1 |``).
DEFINITION = re.compile(rf"^\s*\* (?:\*\*)?({RULE})\b(?![-.\w])|^\| ({RULE}) \|")
#: What the protocol leaves to the map, the runbook and the cost docs: module paths, settings,
#: test paths and the code's own names for the constants and metrics (checked below).
IMPLEMENTATION_DETAIL = re.compile(r"\b[\w/]+\.py\b|\bLM_[A-Z0-9_]+|\btests/|\blightmetrics\.(?!(?:[a-z_]+\.v\d|<))[a-z_]+")
HEADING = re.compile(r"^#{2,3} (\d+)\. |^#{2,3} (\d+\.\d+) ")
CITATION = re.compile(rf"§(\d+(?:\.\d+)?)\s+({RULE})(?![\w-])")


def _lines(text: str) -> list[tuple[str | None, str]]:
    """(section number, line) of every line outside code fences."""
    out: list[tuple[str | None, str]] = []
    section, fenced = None, False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            if m := HEADING.match(line):
                section = m.group(1) or m.group(2)
            out.append((section, line))
    return out


def defined_rules() -> dict[str, list[str]]:
    """Every rule id protocol.md defines, with the section(s) defining it."""
    found: dict[str, list[str]] = {}
    for section, line in _lines(PROTOCOL.read_text(encoding="utf-8")):
        if section is not None and (m := DEFINITION.match(line)):
            found.setdefault((m.group(1) or m.group(2)), []).append(section)
    return found


def protocol_sections() -> set[str]:
    return {s for s, _ in _lines(PROTOCOL.read_text(encoding="utf-8")) if s is not None}


def table(heading: str) -> list[list[str]]:
    """The body rows of the first table under ``## heading`` in the map, as cells."""
    text = MAP.read_text(encoding="utf-8")
    assert f"\n## {heading}\n" in text, f"docs/protocol-map.md has no '## {heading}' section"
    block = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in block.splitlines() if line.startswith("|")]
    return [[c.strip() for c in row.strip("|").split("|")] for row in rows[2:]]


def paths(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _exists(path: str) -> bool:
    """A file, or ``file::name``: a function or class ``name`` defined in it."""
    file, _, name = path.partition("::")
    target = ROOT / file
    if not target.is_file():
        return False
    pattern = rf"^\s*(?:def|class) {re.escape(name)}\b"
    return not name or re.search(pattern, target.read_text(encoding="utf-8"), re.M) is not None


def _module_name(path: str) -> str:
    if path.startswith("shared/"):
        return path[len("shared/"):-3].replace("/", ".")
    if path.startswith("pipeline/"):
        return "lightmetrics_pipeline." + path[len("pipeline/"):-3].replace("/", ".")
    raise AssertionError(f"docs/protocol-map.md: {path} is not an importable module")


# ------------------------------------------------------------------ rules


def test_every_rule_is_defined_once() -> None:
    twice = {rule: sections for rule, sections in defined_rules().items() if len(sections) > 1}
    assert not twice, f"docs/protocol.md defines these rules more than once: {twice}"


def test_the_map_lists_exactly_the_protocols_rules_in_their_sections() -> None:
    rules = defined_rules()
    rows = table("Rules")
    mapped = [row[0] for row in rows]
    assert len(mapped) == len(set(mapped)), "docs/protocol-map.md lists a rule twice"
    missing = sorted(set(rules) - set(mapped))
    assert not missing, f"rules of docs/protocol.md without a row in docs/protocol-map.md: {missing}"
    unknown = sorted(set(mapped) - set(rules))
    assert not unknown, f"docs/protocol-map.md lists rules docs/protocol.md does not define: {unknown}"
    for rule, section, *_ in rows:
        assert rules[rule] == [section], (
            f"docs/protocol-map.md puts {rule} in §{section}; docs/protocol.md defines it in §{rules[rule][0]}")


def test_every_module_and_test_the_map_names_exists() -> None:
    stale = []
    for name in ("Rules", "Sections"):
        for row in table(name):
            for cell in row[-2:]:
                stale += [f"{row[0]}: {p}" for p in paths(cell) if not _exists(p)]
    assert not stale, ("docs/protocol-map.md names paths that do not exist (moved or renamed? update the map): "
                       + "; ".join(stale))


def test_every_rule_has_a_module_and_a_test() -> None:
    for row in table("Rules"):
        assert paths(row[2]) and all(p.startswith("tests/") for p in paths(row[3])) and paths(row[3]), row[0]


def test_the_map_names_only_sections_the_protocol_has() -> None:
    sections = protocol_sections()
    unknown = [row[0] for row in table("Sections") if row[0] not in sections]
    assert not unknown, f"docs/protocol-map.md lists sections docs/protocol.md does not have: {unknown}"


# ------------------------------------------------------------------ settings, constants, metrics


def parameters() -> dict[str, str]:
    """The parameters protocol.md §18.1 lists, with their default or value cell."""
    text = PROTOCOL.read_text(encoding="utf-8")
    assert "\n### 18.1 Parameters\n" in text, "docs/protocol.md has no '### 18.1 Parameters'"
    block = text.split("\n### 18.1 Parameters\n", 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"^\| \*([^*|]+)\* \| [^|]+ \| ([^|]+) \|$", block, re.M))


def _number(cell: str) -> int | None:
    m = re.match(r"`?([\d,]+)", cell.strip())
    return int(m.group(1).replace(",", "")) if m else None


def test_the_protocols_parameters_are_the_maps() -> None:
    """§18.1 names every parameter the map backs with a setting or a constant, with the same
    default or value (numbers compared), and nothing more."""
    protocol = parameters()
    mapped = {row[0]: row[2] for name in ("Settings", "Constants") for row in table(name)}
    assert sorted(protocol) == sorted(mapped), "docs/protocol.md §18.1 and docs/protocol-map.md differ: " + str(
        sorted(set(protocol) ^ set(mapped)))
    for name, value in mapped.items():
        want = _number(paths(value)[0]) if paths(value) else None
        if want is not None:
            assert _number(protocol[name]) == want, f"docs/protocol.md §18.1: *{name}* is {protocol[name]}, the code {want}"


#: Italic words of protocol.md that are emphasis or a term defined where it is used, not a parameter.
EMPHASIS = {"at the write", "before", "candidate hours", "expected", "intent", "it", "italics", "italic", "key",
            "marks", "pre-existing", "submitted", "violation", "warning", "closing", "conflict id",
            "denylist enforcement", "denylist entry", "lift record", "registry item", "batch deletes",
            "the arithmetic"}


def test_every_parameter_and_signal_the_protocol_names_is_defined() -> None:
    """Every *italic* name in protocol.md is a parameter or signal §18.1 lists (or plain emphasis),
    every one §18.1 lists is used, and every signal of the map is one of them."""
    text = PROTOCOL.read_text(encoding="utf-8")
    body, table_18_1 = text.split("\n### 18.1 Parameters\n", 1)
    known = set(parameters()) | set(re.findall(r"^\| \*([^*|]+)\* \| [^|]+ \|$", table_18_1, re.M))
    used = {" ".join(m.split()).lower() for m in re.findall(r"(?<![*\w])\*([A-Za-z][A-Za-z -]*(?:\n *[A-Za-z -]+)?)\*(?![*\w])", body)}
    unknown = sorted(used - {k.lower() for k in known} - EMPHASIS)
    assert not unknown, f"docs/protocol.md names parameters §18.1 does not list: {unknown}"
    unused = sorted(k for k in known if k.lower() not in used)
    assert not unused, f"docs/protocol.md §18.1 lists parameters no rule names: {unused}"
    signals = {row[0] for row in table("Metrics")}
    assert signals <= known, f"signals of docs/protocol-map.md not in docs/protocol.md §18.1: {sorted(signals - known)}"


def test_the_protocol_names_no_module_setting_or_metric() -> None:
    text = PROTOCOL.read_text(encoding="utf-8")
    found = sorted(set(IMPLEMENTATION_DETAIL.findall(text)))
    assert not found, f"docs/protocol.md names implementation detail (move it to docs/protocol-map.md): {found}"
    metrics = [paths(row[1])[0] for row in table("Metrics")]
    named = [m for m in metrics if re.search(rf"`{m}`", text)]
    assert not named, f"docs/protocol.md names metrics (say the signal; the map names the metric): {named}"


def test_every_setting_is_read_where_the_map_says_with_its_default() -> None:
    from lightmetrics.deployment.settings import Settings

    for _, setting_cell, default_cell, module_cell in table("Settings"):
        (setting,) = paths(setting_cell)
        for module in paths(module_cell):
            assert _exists(module), f"docs/protocol-map.md: {setting} is read by {module}, which does not exist"
            assert setting in (ROOT / module).read_text(encoding="utf-8"), f"{module} does not read {setting}"
        field = Settings.model_fields.get(setting[len("LM_"):].lower())
        if default_cell != "—":
            assert field is not None, f"{setting} is not a Settings field"
            assert str(field.default) == paths(default_cell)[0], f"{setting}'s default is {field.default!r}"


def test_every_constant_has_the_value_the_map_says() -> None:
    for _, constant_cell, value_cell, module_cell in table("Constants"):
        (constant,) = paths(constant_cell)
        (module,) = paths(module_cell)
        assert _exists(module), f"docs/protocol-map.md: {constant} is in {module}, which does not exist"
        value = getattr(importlib.import_module(_module_name(module)), constant, None)
        assert value is not None, f"{module} does not define {constant}"
        assert str(value) == paths(value_cell)[0], f"{module}: {constant} is {value!r}"


def test_every_metric_is_emitted_where_the_map_says() -> None:
    for _, metric_cell, module_cell in table("Metrics"):
        (metric,) = paths(metric_cell)
        for module in paths(module_cell):
            assert _exists(module), f"docs/protocol-map.md: {metric} is emitted by {module}, which does not exist"
            source = (ROOT / module.partition("::")[0]).read_text(encoding="utf-8")
            assert re.search(rf"\b{metric}\b", source), (
                f"{module} does not name the metric {metric}")


# ------------------------------------------------------------------ citations and form


def test_every_citation_of_a_rule_names_its_section() -> None:
    """``docs/protocol.md §15 G-I8`` in a comment, a test or a doc resolves: G-I8 is in §15."""
    rules = defined_rules()
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    stale = []
    for name in files:
        if not name.endswith((".py", ".md")):
            continue
        for m in CITATION.finditer((ROOT / name).read_text(encoding="utf-8", errors="replace")):
            section, rule = m.groups()
            if rule in rules and not any(s == section or s.startswith(section + ".") for s in rules[rule]):
                stale.append(f"{name}: '{m.group(0)}' ({rule} is in §{rules[rule][0]})")
    assert not stale, "citations of protocol rules that name another section: " + "; ".join(stale)


def test_protocol_lines_are_at_most_110_characters() -> None:
    long = [n for n, line in enumerate(PROTOCOL.read_text(encoding="utf-8").splitlines(), 1) if len(line) > MAX_LINE]
    assert not long, f"docs/protocol.md lines longer than {MAX_LINE} characters: {long}"


@pytest.mark.parametrize("text, rule", [("* **D5 `accepted-by-blob` before", "D5"), ("* C6 — a lift", "C6"),
                                        ("| I1 | at most one", "I1"), ("  * **L1 a lease", "L1"),
                                        ("* R-I5 — **one bad", "R-I5"), ("* **G-B3 the", "G-B3")])
def test_a_definition_is_recognised(text: str, rule: str) -> None:
    m = DEFINITION.match(text)
    assert m and (m.group(1) or m.group(2)) == rule
