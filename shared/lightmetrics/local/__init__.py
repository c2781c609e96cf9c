"""The embedded local runtime: "AWS on a laptop" for tests, the demo and ``lmctl local up``.

Example::

    >>> from lightmetrics.local import LocalRuntime, provision
    >>> from lightmetrics.deployment.resources import SPEC
    >>> with LocalRuntime(port=4566) as rt:                                  # doctest: +SKIP
    ...     provision(rt, SPEC, bucket="lightmetrics-local", table="lightmetrics-control",
    ...               secret_name="lightmetrics/ingest-tokens")
"""

from lightmetrics.local.function_host import FunctionHost, LambdaContext, function_name_from
from lightmetrics.local.ingest_endpoint import DEFAULT_MAX_BODY_BYTES, IngestHTTPServer
from lightmetrics.local.provision import ProvisionError, provision
from lightmetrics.local.server import ACCOUNT_ID, DEFAULT_PORT, REGION, LocalRuntime, env_exports

__all__ = [
    "ACCOUNT_ID",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_PORT",
    "REGION",
    "FunctionHost",
    "IngestHTTPServer",
    "LambdaContext",
    "LocalRuntime",
    "ProvisionError",
    "env_exports",
    "function_name_from",
    "provision",
]
