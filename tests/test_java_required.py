"""Java 17 is checked up front (issue 17): a local Spark session, and `lmctl demo` before any of
its work, fail with a one-line message that says what to install — not a gateway traceback minutes
later."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from lightmetrics.cli.main import cli
from lightmetrics_pipeline.session import JavaMissing, require_java


def fake_java(tmp_path: Path, version_line: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    java = bin_dir / "java"
    java.write_text(f"#!/bin/sh\necho '{version_line}' >&2\n")
    java.chmod(java.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def test_no_java_and_an_old_java_are_refused_with_what_to_install(tmp_path: Path) -> None:
    with pytest.raises(JavaMissing, match="Java 17 or later and none was found.*JAVA_HOME"):
        require_java(environ={"PATH": "", "JAVA_HOME": str(tmp_path / "nowhere")})
    old = fake_java(tmp_path, 'openjdk version "1.8.0_392"')
    with pytest.raises(JavaMissing, match="is Java 8"):
        require_java(environ={"PATH": str(old)})
    new = fake_java(tmp_path / "17", 'openjdk version "17.0.13" 2024-10-15')
    assert require_java(environ={"PATH": str(new)}) == str(new / "java")
    assert require_java(environ={"PATH": "", "JAVA_HOME": str(new.parent)}) == str(new / "java")


def test_the_demo_says_so_before_any_work(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path), "JAVA_HOME": ""}
    result = CliRunner().invoke(cli, ["demo", "--json"], env=env)
    assert result.exit_code == 2, result.output
    doc = json.loads(result.stdout)
    assert doc["status"] == "error" and "Java 17" in doc["reason"] and "openjdk-17" in doc["reason"]
    assert os.environ.get("JAVA_HOME") != ""  # the runner put the environment back
