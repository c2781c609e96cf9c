"""The Lambda functions' code (``functions/``), imported locally under the name Lambda gives it.

``functions/`` is the functions' code asset, not an installed package (a top-level ``functions``
in site-packages would be a generic name any project could shadow): on AWS each handler string
``functions.<name>.app.handler`` is imported from the asset's root. The local runtime, ``lmctl
invoke``, collector processes and the tests import the repository's folder under that same name.

Example::

    >>> import_handler_module("functions.ingest.app").handler        # doctest: +SKIP
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

#: the repository's functions/ folder (shared/lightmetrics/local/ -> the repository root)
FUNCTIONS_DIR = Path(__file__).resolve().parents[3] / "functions"
PACKAGE = "functions"


def import_functions() -> ModuleType:
    """The ``functions`` package from :data:`FUNCTIONS_DIR` (once per process)."""
    loaded = sys.modules.get(PACKAGE)
    if loaded is not None:
        return loaded
    init = FUNCTIONS_DIR / "__init__.py"
    spec = importlib.util.spec_from_file_location(PACKAGE, init, submodule_search_locations=[str(FUNCTIONS_DIR)])
    if spec is None or spec.loader is None or not init.is_file():
        raise ModuleNotFoundError(f"no functions/ folder at {FUNCTIONS_DIR} (run from a source checkout)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = module
    spec.loader.exec_module(module)
    return module


def import_handler_module(module: str) -> ModuleType:
    """Import a handler's module (``functions.ingest.app``), finding ``functions`` first."""
    if module == PACKAGE or module.startswith(PACKAGE + "."):
        import_functions()
    return importlib.import_module(module)
