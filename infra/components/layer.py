"""The shared Lambda layer: third-party dependencies plus the ``lightmetrics`` package.

Built by ``make layer`` without Docker (``pip install --platform ... --only-binary=:all:``) into
``.layer/python``; synth only packages that directory. ``lightmetrics`` there is what functions run
of ``shared/lightmetrics`` (:mod:`infra.layer_contents`: no local runtime, CLI or harnesses). Synth
refuses when the directory is missing, was built for another architecture, or holds a
``lightmetrics`` that differs from that (a stale layer would deploy old protocol code).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from infra.config import ROOT
from infra.layer_contents import copy_shared_package, differences

LAYER_DIR = ROOT / ".layer"
SHARED_PACKAGE = ROOT / "shared" / "lightmetrics"

#: The one architecture of every function and of the layer's wheels (Makefile LAYER_ARCH).
ARCHITECTURE = lambda_.Architecture.ARM_64
ARCH_NAME = "arm64"
RUNTIME = lambda_.Runtime.PYTHON_3_12


class LayerMissingError(RuntimeError):
    """``.layer/python`` is missing, stale or built for another architecture."""


def check_layer_dir(layer_dir: Path = LAYER_DIR) -> Path:
    """Return ``layer_dir`` if it is a complete, current build; raise LayerMissingError otherwise."""
    python = layer_dir / "python"
    if not python.is_dir():
        raise LayerMissingError(
            f"Lambda layer directory {python} does not exist: run `make layer` first "
            f"(it pip-installs the runtime dependencies for {ARCH_NAME} / Python 3.12 without Docker)"
        )
    marker = layer_dir / "ARCH"
    built_for = marker.read_text().strip() if marker.is_file() else "unknown"
    if built_for != ARCH_NAME:
        raise LayerMissingError(
            f"Lambda layer in {layer_dir} was built for {built_for!r}, the functions run on {ARCH_NAME!r}: "
            "run `make layer`"
        )
    stale = differences(python / "lightmetrics", SHARED_PACKAGE)
    if stale:
        shown = ", ".join(stale[:5]) + (" ..." if len(stale) > 5 else "")
        raise LayerMissingError(
            f"Lambda layer is stale: lightmetrics differs from shared/lightmetrics ({shown}): run `make layer`"
        )
    return layer_dir


def refresh_shared_package(layer_dir: Path = LAYER_DIR) -> bool:
    """Re-copy ``shared/lightmetrics`` into a built layer if it differs (what ``make layer`` does).

    For tests and ``make``-less development loops; returns whether it copied. A missing layer
    directory is left missing (synth then says to run ``make layer``).
    """
    python = layer_dir / "python"
    if not python.is_dir() or not differences(python / "lightmetrics", SHARED_PACKAGE):
        return False
    staging = python / f".lightmetrics-{os.getpid()}"
    copy_shared_package(staging, SHARED_PACKAGE)
    old = python / f".lightmetrics-old-{os.getpid()}"
    if (python / "lightmetrics").exists():
        (python / "lightmetrics").rename(old)
    staging.rename(python / "lightmetrics")
    shutil.rmtree(old, ignore_errors=True)
    return True


class SharedLayer(Construct):
    """``LayerVersion`` from ``.layer`` (the asset's ``python/`` is what Lambda puts on sys.path)."""

    def __init__(self, scope: Construct, construct_id: str, *, layer_dir: Path = LAYER_DIR) -> None:
        super().__init__(scope, construct_id)
        check_layer_dir(layer_dir)
        self.layer = lambda_.LayerVersion(
            self,
            "Layer",
            code=lambda_.Code.from_asset(str(layer_dir), exclude=["ARCH", ".deps-*", "requirements.txt"]),
            compatible_runtimes=[RUNTIME],
            compatible_architectures=[ARCHITECTURE],
            description="lightmetrics core and its dependencies (pydantic, powertools, zstandard, boto3)",
        )
