"""The EMR Serverless job's bundle, built without Docker: what ``cdk synth`` ships as assets.

Three files, all under ``.emr/`` (docs/pipeline.md §7, "Packaging"):

* ``pipeline/emr_main.py`` — the ``entryPoint`` (shipped from the source tree as it is);
* ``.emr/app.zip`` — our pure-Python packages ``lightmetrics`` and ``lightmetrics_pipeline`` (the
  ``pipeline/`` folder), for ``spark.submit.pyFiles`` (``--py-files``);
  rebuilt by synth whenever the sources differ (it needs no pip), byte-identical for identical sources
  so the asset's hash only changes with the code;
* ``.emr/deps.zip`` — the third-party wheels the job imports and the runtime does not provide,
  installed by ``pip install --platform ... --only-binary=:all: --target`` for the job's platform
  (``make emr-bundle``, like the Lambda layer), unpacked by Spark as ``./deps`` (``spark.archives``)
  and put on ``PYTHONPATH``. PySpark is not in it: the release provides Spark.

The job's Python is one constant, :data:`JOB_PYTHON` (the interpreter :data:`JOB_PYTHON_PATH` of
the release's image runs the driver and the workers); the wheels' ABI follows it.

Example (what ``make emr-bundle`` runs)::

    python -m infra.pipeline_bundle deps     # pip, only when the requirements changed
    python -m infra.pipeline_bundle app      # the code zip
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUNDLE_DIR = ROOT / ".emr"
APP_ZIP = BUNDLE_DIR / "app.zip"
DEPS_ZIP = BUNDLE_DIR / "deps.zip"
DEPS_MARKER = BUNDLE_DIR / "deps.json"
ENTRY_POINT = ROOT / "pipeline" / "emr_main.py"

#: The job's Python: emr-spark-8.0.0 ships Python 3.11, 3.12 and 3.13 (release notes); the job runs
#: the image's ``python3.11``, the interpreter the wheels below are built for and the local tests run.
JOB_PYTHON = "3.11"
JOB_PYTHON_PATH = f"/usr/bin/python{JOB_PYTHON}"
#: the application's architecture (infra/components/pipeline.py) as a wheel platform tag
JOB_PLATFORM = "manylinux2014_x86_64"
#: the alias ``spark.archives`` unpacks the dependency zip under (``./deps`` in each working directory)
DEPS_ALIAS = "deps"

#: Provided by the release (Spark) or not imported by the jobs (``lmctl query --plot`` only).
NOT_BUNDLED = ("pyspark", "matplotlib")
#: our packages, at the zip's root: (source directory, name in the zip)
APP_PACKAGES = ((ROOT / "shared" / "lightmetrics", "lightmetrics"), (ROOT / "pipeline", "lightmetrics_pipeline"))
#: parts of installed wheels the job never loads (tests, C headers, Cython sources, scripts)
_PRUNED_DIRS = {"__pycache__", "tests", "include", "bin"}
_PRUNED_SUFFIXES = (".pyc", ".pxd", ".pyx", ".pxi", ".h", ".hpp", ".cc", ".c")
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed: the same files give the same zip (and the same asset hash)


class BundleMissingError(RuntimeError):
    """``.emr/deps.zip`` is missing or was built for other requirements or another platform."""


def requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The job's third-party requirements: the package's dependencies plus the ``pipeline`` extra,
    without what :data:`NOT_BUNDLED` names.

    >>> "pyspark==4.0.2" in requirements(), any(r.startswith("pyarrow") for r in requirements())
    (False, True)
    """
    project = tomllib.loads(pyproject.read_text())["project"]
    wanted = list(project["dependencies"]) + list(project["optional-dependencies"]["pipeline"])
    return [r for r in wanted if _name(r) not in NOT_BUNDLED]


def _name(requirement: str) -> str:
    for i, ch in enumerate(requirement):
        if not (ch.isalnum() or ch in "-_."):
            return requirement[:i].lower()
    return requirement.lower()


def deps_identity() -> dict[str, object]:
    """What ``deps.zip`` was built for; synth refuses a zip whose marker says otherwise."""
    return {"python": JOB_PYTHON, "platform": JOB_PLATFORM, "requirements": requirements()}


def _write_zip(dest: Path, files: list[tuple[str, bytes]]) -> None:
    """A zip of ``(name, content)`` with fixed times and modes: identical input, identical bytes."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as zf:
        for name, content in sorted(files):
            info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, content)
    tmp.replace(dest)


def _tree(src: Path, prefix: str) -> list[tuple[str, bytes]]:
    out = []
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if path.is_dir() or any(p in _PRUNED_DIRS for p in rel.parts[:-1]) or path.name.endswith(_PRUNED_SUFFIXES):
            continue
        out.append((f"{prefix}{rel.as_posix()}", path.read_bytes()))
    return out


def app_files() -> list[tuple[str, bytes]]:
    """``lightmetrics/…`` and ``lightmetrics_pipeline/…`` (the ``pipeline/`` folder) as in the source tree (no caches)."""
    return [f for src, name in APP_PACKAGES for f in _tree(src, f"{name}/")]


def ensure_app_zip(dest: Path = APP_ZIP) -> Path:
    """(Re)build ``app.zip`` unless it already holds exactly the sources; returns its path."""
    files = app_files()
    if dest.is_file():
        with zipfile.ZipFile(dest) as zf:
            if sorted(zf.namelist()) == sorted(n for n, _ in files) and all(zf.read(n) == c for n, c in files):
                return dest
    _write_zip(dest, files)
    return dest


def build_deps(dest: Path = DEPS_ZIP, *, python: str = sys.executable) -> Path:
    """pip-install :func:`requirements` for the job's platform into a staging directory and zip it.
    Honours the machine's pip configuration (index, find-links); no Docker, no target interpreter."""
    staging = BUNDLE_DIR / "deps"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-compile", "--platform", JOB_PLATFORM,
                    "--implementation", "cp", "--python-version", JOB_PYTHON, "--only-binary=:all:",
                    "--target", str(staging), *requirements()], check=True)
    _write_zip(dest, _tree(staging, ""))
    shutil.rmtree(staging, ignore_errors=True)
    DEPS_MARKER.write_text(json.dumps(deps_identity(), indent=1, sort_keys=True) + "\n")
    return dest


def check_deps(dest: Path = DEPS_ZIP, marker: Path = DEPS_MARKER) -> Path:
    """``dest`` if it was built for today's requirements and platform; :class:`BundleMissingError` otherwise."""
    if not dest.is_file() or not marker.is_file():
        raise BundleMissingError(f"the pipeline's dependency zip {dest} does not exist: run `make emr-bundle` (it "
                                 f"pip-installs the job's wheels for {JOB_PLATFORM} / Python {JOB_PYTHON} without Docker)")
    built_for = json.loads(marker.read_text())
    if built_for != deps_identity():
        raise BundleMissingError(f"the pipeline's dependency zip {dest} is stale (built for {built_for}, the job needs "
                                 f"{deps_identity()}): run `make emr-bundle`")
    return dest


def main(argv: list[str]) -> int:
    what = argv[0] if argv else ""
    if what == "deps":
        print(f"{build_deps()} ({DEPS_ZIP.stat().st_size // (1 << 20)} MiB, Python {JOB_PYTHON}, {JOB_PLATFORM})")
    elif what == "app":
        print(ensure_app_zip())
    elif what == "requirements":
        sys.stdout.write("".join(f"{r}\n" for r in requirements()))
    else:
        print("usage: python -m infra.pipeline_bundle deps|app|requirements", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


__all__ = ["APP_ZIP", "BUNDLE_DIR", "BundleMissingError", "DEPS_ALIAS", "DEPS_ZIP", "ENTRY_POINT", "JOB_PLATFORM",
           "JOB_PYTHON", "JOB_PYTHON_PATH", "app_files", "build_deps", "check_deps", "deps_identity",
           "ensure_app_zip", "requirements"]
