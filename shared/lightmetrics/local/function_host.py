"""A local Lambda function host: WSGI middleware in front of moto's server.

moto's own Lambda needs Docker, which these machines do not have. Step Functions Lambda tasks
(and any boto3 ``lambda.invoke``) call ``POST /2015-03-31/functions/<name>/invocations`` on the
moto port, so this middleware answers that path by running an in-process Python handler and
passes every other request to moto unchanged.

Example::

    >>> host = FunctionHost(moto_app, functions={"echo": lambda event, ctx: event})  # doctest: +SKIP
    >>> # boto3.client("lambda", endpoint_url=...).invoke(FunctionName="echo", Payload=b'{"a":1}')
"""

from __future__ import annotations

import base64
import json
import logging
import re
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from contextlib import nullcontext
from dataclasses import replace
from typing import Any, cast
from urllib.parse import unquote

from lightmetrics.deployment.resource_types import FunctionSpec
from lightmetrics.deployment.resources import SPEC
from lightmetrics.local.function_code import import_handler_module
from lightmetrics.protocol.hosting import current, hosted

__all__ = ["FunctionHost", "Handler", "LambdaContext", "function_name_from", "invoke_handler"]

LOG = logging.getLogger(__name__)

#: ``handler(event, context) -> JSON-able result``
Handler = Callable[[Any, "LambdaContext"], Any]

ACCOUNT_ID = "123456789012"
REGION = "us-east-1"
_INVOKE_PREFIX = "/2015-03-31/functions/"
#: GET here returns the request counts (per service, and per service:component) as JSON.
COUNTS_PATH = "/_lightmetrics/request-counts"
_INVOKE_SUFFIX = "/invocations"


class LambdaContext:
    """The subset of the Lambda Python context object that handlers (and Powertools) use."""

    def __init__(
        self,
        function_name: str,
        *,
        memory_limit_in_mb: int = 512,
        timeout_s: float = 30.0,
        account_id: str = ACCOUNT_ID,
        region: str = REGION,
    ) -> None:
        self.function_name = function_name
        self.function_version = "$LATEST"
        self.invoked_function_arn = f"arn:aws:lambda:{region}:{account_id}:function:{function_name}"
        self.memory_limit_in_mb = memory_limit_in_mb
        self.aws_request_id = str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{function_name}"
        self.log_stream_name = f"local/{self.aws_request_id}"
        self._deadline = time.monotonic() + timeout_s

    def get_remaining_time_in_millis(self) -> int:
        """Milliseconds left before the (advisory: nothing kills the handler locally) timeout."""
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def function_name_from(name_or_arn: str) -> str:
    """``echo``, ``123456789012:function:echo`` or a full (qualified) ARN -> ``echo``."""
    name = unquote(name_or_arn)
    if ":function:" in name:
        name = name.split(":function:", 1)[1]
    return name.split(":", 1)[0]  # drop a ``:$LATEST`` / alias qualifier


def _error_body(exc: BaseException, error_type: str | None = None, *, skip_frames: int = 0) -> dict[str, Any]:
    """The body real Lambda returns for an unhandled Python exception."""
    tb = exc.__traceback__
    for _ in range(skip_frames):  # hide the host's own frames, as the Lambda runtime does
        tb = tb.tb_next if tb is not None else None
    return {
        "errorMessage": str(exc),
        "errorType": error_type or type(exc).__name__,
        "requestId": "",
        "stackTrace": traceback.format_list(traceback.extract_tb(tb)),
    }


def invoke_handler(handler: Handler, event: Any, context: LambdaContext) -> tuple[bytes, bool]:
    """Run ``handler`` like the Lambda runtime does: ``(payload bytes, failed?)``."""
    try:
        result = handler(event, context)
    except Exception as exc:  # a handler error is a result, not a host failure
        LOG.info("function %s raised %s", context.function_name, exc, exc_info=True)
        body = _error_body(exc, skip_frames=1)
        body["requestId"] = context.aws_request_id
        return json.dumps(body).encode(), True
    try:
        return json.dumps(result).encode(), False
    except (TypeError, ValueError) as exc:
        body = _error_body(exc, "Runtime.MarshalError")
        body["errorMessage"] = f"Unable to marshal response: {exc}"
        return json.dumps(body).encode(), True


_COMPONENT = re.compile(r"lm-component/([A-Za-z0-9_.-]+)")


def _service_of(authorization: str) -> str:
    """``s3`` from ``AWS4-HMAC-SHA256 Credential=AKID/20261125/us-east-1/s3/aws4_request, ...``."""
    _, _, rest = authorization.partition("Credential=")
    parts = rest.split(",", 1)[0].split("/")
    return parts[3] if len(parts) >= 5 else "unsigned"


class FunctionHost:
    """WSGI middleware: Lambda ``Invoke`` runs in-process handlers, everything else goes to ``app``.

    ``functions`` is an explicit registry (name -> callable). Without it, handlers come from
    ``specs`` (default: the resource spec's functions) and are imported on first invocation, so
    a broken handler module fails its invocations (``Runtime.ImportModuleError``, as on AWS)
    rather than the server. Names not in the registry go to moto, which answers 404.
    """

    def __init__(
        self,
        app: Callable[..., Any],
        functions: Mapping[str, Handler] | None = None,
        *,
        specs: Iterable[FunctionSpec] = SPEC.functions,
        credentials_for: Callable[[str], Mapping[str, str] | None] | None = None,
    ) -> None:
        self.app = app
        #: function name -> the credentials it runs with (its role's), None: the host's own
        self._credentials_for = credentials_for
        self._explicit = dict(functions) if functions is not None else None
        self._specs = {s.name: s for s in specs}
        self._loaded: dict[str, Handler] = {}
        self._registered: dict[str, Handler] = {}
        self._lock = threading.Lock()
        #: Requests that reached moto, per AWS service (from the SigV4 credential scope). The
        #: demo and benchmarks read S3 request totals here, across every client process.
        self.request_counts: Counter[str] = Counter()

    def names(self) -> list[str]:
        """Function names this host serves."""
        base = self._explicit if self._explicit is not None else self._specs
        return sorted(set(base) | set(self._registered))

    def register(self, name: str, handler: Handler) -> None:
        """Serve ``name`` with ``handler`` (e.g. a system's walk tasks bound to its own settings)."""
        with self._lock:
            self._registered[name] = handler

    def resolve(self, name: str) -> Handler | None:
        """The handler for ``name`` (importing it on first use), or None if not hosted here."""
        with self._lock:
            if name in self._registered:
                return self._registered[name]
        if self._explicit is not None:
            return self._explicit.get(name)
        spec = self._specs.get(name)
        if spec is None:
            return None
        with self._lock:
            if name not in self._loaded:
                module = import_handler_module(spec.module)
                self._loaded[name] = getattr(module, spec.attr)
            return self._loaded[name]

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path: str = environ.get("PATH_INFO", "")
        if path == COUNTS_PATH and environ.get("REQUEST_METHOD") == "GET":
            with self._lock:
                body = json.dumps(dict(self.request_counts), sort_keys=True).encode()
            start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        if (
            environ.get("REQUEST_METHOD") == "POST"
            and path.startswith(_INVOKE_PREFIX)
            and path.endswith(_INVOKE_SUFFIX)
        ):
            raw_name = path[len(_INVOKE_PREFIX) : -len(_INVOKE_SUFFIX)]
            name = function_name_from(raw_name)
            if name in self.names():
                return self._invoke(name, environ, start_response)
        service = _service_of(environ.get("HTTP_AUTHORIZATION", ""))
        component = _COMPONENT.search(environ.get("HTTP_USER_AGENT", ""))
        with self._lock:
            self.request_counts[service] += 1
            if component:
                self.request_counts[f"{service}:{component.group(1)}"] += 1
        return cast(Iterable[bytes], self.app(environ, start_response))

    def _invoke(self, name: str, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        raw = environ["wsgi.input"].read(length) if length else b""
        invocation_type = environ.get("HTTP_X_AMZ_INVOCATION_TYPE", "RequestResponse")
        context = LambdaContext(name)
        headers = [
            ("Content-Type", "application/json"),
            ("X-Amzn-RequestId", context.aws_request_id),
            ("X-Amz-Executed-Version", "$LATEST"),
        ]
        try:
            event = json.loads(raw) if raw.strip() else {}  # real Lambda passes {} for no payload
        except ValueError as exc:
            body = {"Type": "User", "message": f"Could not parse request body into json: {exc}"}
            headers.append(("X-Amzn-ErrorType", "InvalidRequestContentException"))
            start_response("400 Bad Request", headers)
            return [json.dumps(body).encode()]
        if invocation_type == "DryRun":
            start_response("204 No Content", headers)
            return [b""]
        try:
            handler = self.resolve(name)
        except Exception as exc:  # import failure: an invocation error on AWS too
            payload, failed = json.dumps(_error_body(exc, "Runtime.ImportModuleError")).encode(), True
        else:
            assert handler is not None
            credentials = self._credentials_for(name) if self._credentials_for else None
            # the function's clients sign as its role (composition.hosting), as the Lambda runtime's do
            with hosted(replace(current(), aws_credentials=credentials)) if credentials else nullcontext():
                payload, failed = invoke_handler(handler, event, context)
        if invocation_type == "Event":
            # Run synchronously, answer 202: deterministic for tests; errors only get logged.
            if failed:
                LOG.warning(
                    "async invocation of %s failed: %s", name, payload[:2000].decode(errors="replace")
                )
            start_response("202 Accepted", headers)
            return [b""]
        if failed:
            headers.append(("X-Amz-Function-Error", "Unhandled"))
        if environ.get("HTTP_X_AMZ_LOG_TYPE") == "Tail":
            headers.append(("X-Amz-Log-Result", base64.b64encode(b"").decode()))
        headers.append(("Content-Length", str(len(payload))))
        start_response("200 OK", headers)
        return [payload]
