"""Print the layer's requirements: the ``[project] dependencies`` of pyproject.toml, one a line.

``make layer`` pip-installs them for the Lambda platform, so the layer and the package agree.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path


def main() -> int:
    root = Path(__file__).resolve().parents[1]
    deps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    sys.stdout.write("".join(f"{d}\n" for d in deps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
