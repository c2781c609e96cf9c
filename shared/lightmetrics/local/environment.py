"""The environment a local Lambda handler (or collector process) runs with.

One function builds it so ``lmctl local up``, the demo's collector processes and the tests
configure handlers identically: AWS calls go to the embedded runtime, ``LM_*`` name its
resources, and Powertools stays quiet (no X-Ray daemon, metrics not flushed to stdout).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from lightmetrics.local.server import ACCOUNT_ID, REGION

#: Powertools settings for handlers running inside a local process (no X-Ray, no EMF on stdout)
QUIET_POWERTOOLS = {
    "POWERTOOLS_TRACE_DISABLED": "true",
    "POWERTOOLS_METRICS_DISABLED": "true",
    "POWERTOOLS_METRICS_NAMESPACE": "Lightmetrics",
    "POWERTOOLS_LOG_LEVEL": "WARNING",
}


def local_environment(endpoint_url: str, settings: Mapping[str, object]) -> dict[str, str]:
    """Variables to export for a process that talks to the local runtime at ``endpoint_url``."""
    env = {
        "AWS_ENDPOINT_URL": endpoint_url,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_REGION": REGION,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "LM_LOCAL_ACCOUNT_ID": ACCOUNT_ID,
        **QUIET_POWERTOOLS,
    }
    for name, value in settings.items():
        if value is not None:
            env[f"LM_{name.upper()}"] = str(value)
    return env


def local_env_file(port: int) -> Path:
    """Where ``lmctl local up --port PORT`` keeps its ``export`` lines while it runs (``lmctl env
    --local`` prints them): ``$XDG_STATE_HOME/lightmetrics/local-<port>.env``, else under
    ``~/.local/state``."""
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return base / "lightmetrics" / f"local-{port}.env"

