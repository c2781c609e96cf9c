"""The local admin endpoint: the admin Lambda behind a SigV4-checking stand-in for its IAM Function URL.

Port convention (docs/deploy.md, the local runtime): moto on ``--port``, ingest on port + 1, **admin on port + 2**.
Requests must be SigV4-signed for service ``lambda`` in ``us-east-1`` with the local runtime's
credentials (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``testing``/``testing`` by default),
e.g. ``awscurl --service lambda http://127.0.0.1:4568/conflicts``; anything else gets 403.

Example::

    >>> srv = admin_server(handler, port=rt.port + ADMIN_PORT_OFFSET).start()     # doctest: +SKIP
    >>> srv.url                                                                  # doctest: +SKIP
    'http://127.0.0.1:4568'
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from lightmetrics.local.ingest_endpoint import IngestHTTPServer
from lightmetrics.local.sigv4 import iam_guard

ADMIN_PORT_OFFSET = 2


def local_credentials() -> dict[str, str]:
    """access key -> secret key the local endpoint accepts (the runtime's dummy credentials)."""
    return {os.environ.get("AWS_ACCESS_KEY_ID", "testing"): os.environ.get("AWS_SECRET_ACCESS_KEY", "testing")}


def admin_server(handler: Any, *, port: int, host: str = "127.0.0.1",
                 credentials: Mapping[str, str] | None = None) -> IngestHTTPServer:
    """An HTTP server (the same Function URL emulation as ingest) running ``handler`` behind SigV4."""
    guarded = iam_guard(handler, dict(credentials) if credentials is not None else local_credentials())
    return IngestHTTPServer(guarded, port=port, host=host, max_body_bytes=64 * 1024, function_name="admin")


__all__ = ["ADMIN_PORT_OFFSET", "admin_server", "local_credentials"]
