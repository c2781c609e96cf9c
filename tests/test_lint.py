"""Lint and types are part of the suite (issue 16): ruff (pyflakes, pycodestyle, bugbear, sorted
imports) over the repository, and ``mypy --strict`` over the layer's protocol core, services and
adapters and the functions; ``pyproject.toml`` says what each covers and which rules it leaves out."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_finds_nothing() -> None:
    r = run("ruff", "check", "--no-cache", ".")
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_strict_finds_nothing_in_the_layer_and_the_functions() -> None:
    r = run("mypy")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Success" in r.stdout and "source files" in r.stdout, r.stdout


def test_the_checkers_see_what_they_forbid(tmp_path: Path) -> None:
    """Neither check is vacuous: a planted unused import and a planted type error are reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\n\ndef f(x: int) -> str:\n    return x\n")
    assert run("ruff", "check", "--no-cache", "--isolated", "--select", "F", str(bad)).returncode == 1
    r = run("mypy", "--strict", "--no-incremental", str(bad))
    assert r.returncode == 1 and "Incompatible return value" in r.stdout, r.stdout
