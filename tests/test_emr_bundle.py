"""The EMR job's bundle builder (infra/pipeline_bundle.py): what goes in, and that synth can trust it."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from infra import pipeline_bundle as bundle


def test_requirements_are_the_packages_and_the_pipeline_extra_without_spark() -> None:
    import tomllib

    project = tomllib.loads((bundle.ROOT / "pyproject.toml").read_text())["project"]
    wanted = set(project["dependencies"]) | set(project["optional-dependencies"]["pipeline"])
    got = bundle.requirements()
    assert set(got) == {r for r in wanted if not r.startswith(("pyspark", "matplotlib"))}
    assert any(r.startswith("pydantic") for r in got) and any(r.startswith("pyarrow") for r in got)


def test_the_bundle_writes_parquet_with_the_pyarrow_that_runs_locally() -> None:
    """A v3 rollup object is named by its bytes, and Parquet's footer names the writer's version:
    the job's pyarrow and the local one must be the same, or a local rerun of an hour the job wrote
    would not be a 412 (docs/pipeline.md §6)."""
    import pyarrow

    if not bundle.DEPS_ZIP.is_file():
        pytest.fail("no .emr/deps.zip: run `make emr-bundle` (make test does)")
    with zipfile.ZipFile(bundle.DEPS_ZIP) as z:
        bundled = {n.split("/")[0].removeprefix("pyarrow-").removesuffix(".dist-info")
                   for n in z.namelist() if n.startswith("pyarrow-") and ".dist-info/" in n}
    assert bundled == {pyarrow.__version__}
    assert f"pyarrow=={pyarrow.__version__}" in bundle.requirements()


def test_the_code_zip_is_byte_identical_for_identical_sources_and_follows_them(tmp_path: Path) -> None:
    """Identical sources -> identical bytes (so the CDK asset hash changes only with the code); a
    changed source -> a rebuilt zip holding it."""
    a, b = tmp_path / "a.zip", tmp_path / "b.zip"
    bundle.ensure_app_zip(a)
    bundle.ensure_app_zip(b)
    assert a.read_bytes() == b.read_bytes()
    with zipfile.ZipFile(a) as zf:
        names = set(zf.namelist())
        assert zf.read("lightmetrics_pipeline/jobs.py") == (bundle.ROOT / "pipeline" / "jobs.py").read_bytes()
    assert {"lightmetrics/__init__.py", "lightmetrics_pipeline/__init__.py", "lightmetrics_pipeline/emr_main.py"} <= names
    assert not any(n.startswith("pipeline/") for n in names)
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)

    stale = tmp_path / "stale.zip"
    bundle._write_zip(stale, [("lightmetrics_pipeline/jobs.py", b"old")])
    bundle.ensure_app_zip(stale)
    assert stale.read_bytes() == a.read_bytes()


def test_synth_refuses_a_missing_or_stale_dependency_zip(tmp_path: Path) -> None:
    deps, marker = tmp_path / "deps.zip", tmp_path / "deps.json"
    with pytest.raises(bundle.BundleMissingError, match="make emr-bundle"):
        bundle.check_deps(deps, marker)
    bundle._write_zip(deps, [("x.py", b"")])
    marker.write_text(json.dumps({**bundle.deps_identity(), "python": "3.9"}))
    with pytest.raises(bundle.BundleMissingError, match="stale"):
        bundle.check_deps(deps, marker)
    marker.write_text(json.dumps(bundle.deps_identity()))
    assert bundle.check_deps(deps, marker) == deps
