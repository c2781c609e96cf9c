"""The embedded local runtime: moto's server plus a Lambda function host.

:class:`LocalRuntime` runs moto's WSGI application (S3, SQS, DynamoDB, Secrets Manager, Step
Functions, ...) in a background thread of this process, behind :class:`FunctionHost`, with Step
Functions set to really execute ASL. The local stand-in for the ingest Lambda's Function URL is
:class:`lightmetrics.local.ingest_endpoint.IngestHTTPServer`.

moto keeps its state in module globals, so it belongs to the process, not to a runtime object:
run one runtime per process (``MOTO_PORT`` and moto's config are process-wide as well).

Example::

    >>> with LocalRuntime(port=4566, functions={"echo": lambda e, c: e}) as rt:   # doctest: +SKIP
    ...     rt.boto3_client("s3").create_bucket(Bucket="b")
    ...     print("\\n".join(env_exports(rt, {"LM_BUCKET": "b"})))
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, Self

from werkzeug.serving import ThreadedWSGIServer

from lightmetrics.deployment.resource_types import ResourceSpec
from lightmetrics.deployment.resources import SPEC
from lightmetrics.local.function_host import ACCOUNT_ID, REGION, FunctionHost, Handler
from lightmetrics.local.hosting import install_from_env
from lightmetrics.local.sockets import ConnectionTracking, listen
from lightmetrics.protocol.hosting import Host, install
from lightmetrics.protocol.hosting import current as current_host

__all__ = [
    "ACCOUNT_ID",
    "DEFAULT_PORT",
    "REGION",
    "LocalRuntime",
    "env_exports",
    "exit_served_process",
]

LOG = logging.getLogger(__name__)

DEFAULT_PORT = 4566
_DUMMY_CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


class _MotoWSGIServer(ConnectionTracking, ThreadedWSGIServer):
    def __init__(self, sock: socket.socket, app: Callable[..., Any], handler: type) -> None:
        self._init_tracking()
        host, port = sock.getsockname()[:2]
        # fd=: werkzeug dups the already-bound socket instead of binding (see listen).
        super().__init__(host, port, app, handler, fd=sock.fileno())


def _quiet_moto_handler() -> type:
    from moto.moto_server.werkzeug_app import MotoRequestHandler

    class _Handler(MotoRequestHandler):
        """moto's handler, logging through ``logging`` (werkzeug prints every request to stderr)."""

        def log(self, type: str, message: str, *args: Any) -> None:
            level = logging.WARNING if type == "error" else logging.DEBUG
            LOG.log(level, "moto %s - " + message, self.address_string(), *args)

    return _Handler


def runtime_client(endpoint_url: str, service: str, **kwargs: Any) -> Any:
    """A boto3 client for a local runtime at ``endpoint_url`` (dummy credentials, us-east-1)."""
    import boto3
    import botocore.session

    params: dict[str, Any] = {"endpoint_url": endpoint_url, "region_name": REGION}
    params.update(_DUMMY_CREDENTIALS)  # the deployer's (lightmetrics.local.iam_enforcement) ...
    params.update(current_host().aws_credentials or {})  # ... or, in a hosted function, its role's
    params.update(kwargs)
    # A fresh session per client: boto3's default session is not safe to share across threads.
    # The sessions share one botocore data loader, so service models and endpoint data are parsed
    # once per process rather than once per client (about 250 ms each).
    core = botocore.session.Session()
    core.register_component("data_loader", _shared_loader())
    return boto3.session.Session(botocore_session=core).client(service, **params)


_LOADER: list[Any] = []
_LOADER_LOCK = threading.Lock()


def _shared_loader() -> Any:
    import botocore.loaders

    with _LOADER_LOCK:
        if not _LOADER:
            _LOADER.append(botocore.loaders.create_loader())
        return _LOADER[0]


def _cache_moto_module_list() -> None:
    """Make moto's per-request backend lookup cheap.

    moto's dispatcher lists its own package directory (``os.listdir`` + ``isdir`` over ~170
    entries) on every request, while holding a global lock; measured here that serialises the
    server at ~7 ms per request. The list cannot change while the process runs, so compute it once.
    """
    import moto.backends as moto_backends

    if getattr(moto_backends.list_of_moto_modules, "_lm_cached", False):
        return
    modules = tuple(moto_backends.list_of_moto_modules())

    def cached() -> tuple[str, ...]:
        return modules

    cached._lm_cached = True  # type: ignore[attr-defined]
    moto_backends.list_of_moto_modules = cached  # type: ignore[assignment]


def _cache_moto_lambda_clients() -> None:
    """Reuse one boto3 Lambda client per (region, port) in moto's Step Functions interpreter.

    moto builds a fresh boto3 client for every Lambda task it runs (about 8 ms of CPU each, a
    large share of a task's local cost); every such client points at this process's function
    host, and botocore clients are thread-safe, so one per (region, ``MOTO_PORT``) serves all.
    """
    from moto.stepfunctions.parser.asl.component.state.exec.state_task import lambda_eval_utils

    if getattr(lambda_eval_utils.boto_client_for, "_lm_cached", False):
        return
    original = lambda_eval_utils.boto_client_for
    cache: dict[tuple[str, str, str | None], Any] = {}
    lock = threading.Lock()

    def cached(region: str, service: str, state_credentials: Any = None) -> Any:
        key = (region, service, os.environ.get("MOTO_PORT"))
        with lock:
            if key not in cache:
                cache[key] = original(region=region, service=service, state_credentials=state_credentials)
            return cache[key]

    cached._lm_cached = True  # type: ignore[attr-defined]
    lambda_eval_utils.boto_client_for = cached  # type: ignore[assignment]


def _name_unnamed_executions() -> None:
    """A ``StartExecution`` without ``name`` gets a UUID, as AWS gives it (moto's interpreter names it
    ``None``, so a second unnamed start would fail with ExecutionAlreadyExists). In the backend, not by
    rewriting the request: its body is what its signature covers."""
    import uuid

    from moto.stepfunctions.parser.models import StepFunctionsParserBackend

    if getattr(StepFunctionsParserBackend.start_execution, "_lm_named", False):
        return
    original = StepFunctionsParserBackend.start_execution

    def start_execution(self: Any, state_machine_arn: str, name: Any = None, *args: Any, **kwargs: Any) -> Any:
        return original(self, state_machine_arn, name or str(uuid.uuid4()), *args, **kwargs)

    start_execution._lm_named = True  # type: ignore[attr-defined]
    StepFunctionsParserBackend.start_execution = start_execution  # type: ignore[method-assign]


class LocalRuntime:
    """moto's server with the local function host in front, in a background thread.

    Example::

        >>> rt = LocalRuntime(port=0, functions={"echo": lambda e, c: e}).start()  # doctest: +SKIP
        >>> rt.boto3_client("lambda").invoke(FunctionName="echo", Payload=b"{}")  # doctest: +SKIP
        >>> rt.stop()                                                            # doctest: +SKIP
    """

    account_id = ACCOUNT_ID
    region = REGION

    def __init__(
        self,
        port: int = DEFAULT_PORT,
        host: str = "127.0.0.1",
        functions: Mapping[str, Handler] | None = None,
        *,
        spec: ResourceSpec = SPEC,
        enforce_iam: bool = True,
    ) -> None:
        self.host = host
        #: moto checks every request against its principal's policies (lightmetrics.local.iam_enforcement)
        self.enforce_iam = enforce_iam
        self._saved_enforcement: bool | None = None
        self.port = port  # 0 picks a free port at start()
        self.spec = spec
        self._functions = functions
        self._server: _MotoWSGIServer | None = None
        self._thread: threading.Thread | None = None
        self._saved_env: str | None = None
        self._saved_sfn_config: dict[str, Any] | None = None
        self._saved_host: Host | None = None
        self.function_host: FunctionHost | None = None

    @property
    def endpoint_url(self) -> str:
        """``http://<host>:<port>``, for ``AWS_ENDPOINT_URL`` and boto3's ``endpoint_url``."""
        return f"http://{self.host}:{self.port}"

    @property
    def ingest_port(self) -> int:
        """The ingest HTTP endpoint's port by convention: moto's port + 1."""
        return self.port + 1

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> Self:
        """Bind, configure moto, serve in a daemon thread and wait until it answers."""
        if self._server is not None:
            raise RuntimeError("LocalRuntime already started")
        from moto.core.config import default_user_config
        from moto.moto_api._internal.models import moto_api_backend
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

        _cache_moto_module_list()
        _cache_moto_lambda_clients()
        _name_unnamed_executions()
        # moto logs every failed state (a refused walk start, a task error) at ERROR with a
        # multi-kilobyte repr of the state; the execution history already records each failure.
        logging.getLogger("moto.stepfunctions.parser.asl.component.eval_component").setLevel(logging.CRITICAL)
        sock = listen(self.host, self.port)
        try:
            self.port = sock.getsockname()[1]
            # Step Functions Lambda tasks call back into "http://localhost:$MOTO_PORT".
            self._saved_env = os.environ.get("MOTO_PORT")
            os.environ["MOTO_PORT"] = str(self.port)
            # Same effect as POST /moto-api/config; without it moto only records executions.
            self._saved_sfn_config = dict(default_user_config.get("stepfunctions", {}))
            moto_api_backend.set_config({"stepfunctions": {"execute_state_machine": True}})
            # This process now hosts functions: it is their host (the local runtime's switches,
            # LM_FAULTS and friends, are read here and nowhere in the functions' code).
            self._saved_host = install_from_env()
            if self.enforce_iam:
                from lightmetrics.local.iam_enforcement import enforce

                self._saved_enforcement = enforce(True)
            self.function_host = FunctionHost(
                DomainDispatcherApplication(create_backend_app), self._functions, specs=self.spec.functions,
                credentials_for=self.function_credentials if self.enforce_iam else None,
            )
            self._server = _MotoWSGIServer(sock, self.function_host, _quiet_moto_handler())
        except BaseException:
            self._restore_process_settings()
            raise
        finally:
            sock.close()  # the server holds its own dup
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            daemon=True,
            name="lm-local-moto",
        )
        self._thread.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout_s: float = 10.0) -> None:
        """Poll ``GET /moto-api/config`` until the server answers (TimeoutError otherwise)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"{self.endpoint_url}/moto-api/config", timeout=1.0) as resp:
                    resp.read()
                    return
            except (urllib.error.URLError, OSError) as exc:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"local runtime at {self.endpoint_url} not ready: {exc}") from exc
                time.sleep(0.05)

    def stop(self) -> None:
        """Stop serving, close every connection, join the threads, free the port."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()  # werkzeug's serve_forever closes the listening socket on exit
            server.close_connections()
            server.server_close()
        if thread is not None:
            thread.join(5.0)
        self._restore_process_settings()

    def function_credentials(self, name: str) -> dict[str, str] | None:
        """The credentials function ``name`` runs with: its role's (lightmetrics.local.principals)."""
        from lightmetrics.local.principals import function_credentials

        return function_credentials(self.deployer_client, self.endpoint_url, name)

    def deployer_client(self, service: str, **kwargs: Any) -> Any:
        """A client signing as the deployer, whatever code it is built in."""
        return runtime_client(self.endpoint_url, service, **{**_DUMMY_CREDENTIALS, "aws_session_token": None, **kwargs})

    def _restore_process_settings(self) -> None:
        if self._saved_enforcement is not None:
            from lightmetrics.local.iam_enforcement import enforce

            enforce(self._saved_enforcement)
            self._saved_enforcement = None
        if self._saved_host is not None:
            install(self._saved_host)
            self._saved_host = None
        if self._saved_sfn_config is not None:
            from moto.core.config import default_user_config

            default_user_config["stepfunctions"] = self._saved_sfn_config  # type: ignore[typeddict-item]
            self._saved_sfn_config = None
        if os.environ.get("MOTO_PORT") == str(self.port):
            if self._saved_env is None:
                os.environ.pop("MOTO_PORT", None)
            else:
                os.environ["MOTO_PORT"] = self._saved_env

    def reset(self) -> None:
        """Drop all moto state (every service, the whole process)."""
        from moto.moto_api._internal.models import moto_api_backend

        moto_api_backend.reset()
        from lightmetrics.local.principals import forget_credentials

        forget_credentials(self.endpoint_url)
        if self.enforce_iam:
            from lightmetrics.local.iam_enforcement import ensure_deployer

            ensure_deployer()

    def request_count(self, service: str, component: str | None = None) -> int:
        """Requests to ``service`` (e.g. ``"s3"``) that reached moto since start, from any process;
        with ``component``, only those whose User-Agent carries ``lm-component/<component>``."""
        key = f"{service}:{component}" if component else service
        return self.function_host.request_counts[key] if self.function_host else 0

    def boto3_client(self, service: str, **kwargs: Any) -> Any:
        """A boto3 client for this runtime (dummy credentials, us-east-1)."""
        return runtime_client(self.endpoint_url, service, **kwargs)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class RemoteRuntime:
    """A local runtime served by another process (``python -m lightmetrics.local.server``).

    Same client-side surface as :class:`LocalRuntime` (``endpoint_url``, ``boto3_client``,
    ``request_count``); used by the demo so moto gets a core of its own.
    """

    account_id = ACCOUNT_ID
    region = REGION

    def __init__(self, endpoint_url: str, process: Any = None) -> None:
        self.endpoint_url = endpoint_url.rstrip("/")
        self.port = int(self.endpoint_url.rsplit(":", 1)[1])
        self.process = process

    @classmethod
    def spawn(cls, port: int = 0, timeout_s: float = 30.0, env: Mapping[str, str] | None = None) -> "RemoteRuntime":
        """Start the server process. ``env`` (``LM_*``) configures the functions it hosts: the
        state machines' Lambda tasks run there, resolved from the resource spec, and call back
        into that same server (the child sets its own ``AWS_ENDPOINT_URL``)."""
        import subprocess
        import tempfile

        with tempfile.NamedTemporaryFile(prefix="lm-runtime-", suffix=".port", delete=False) as fh:
            port_file = fh.name
        os.unlink(port_file)
        child_env = {**os.environ, **(env or {})}
        proc = subprocess.Popen([sys.executable, "-m", "lightmetrics.local.server", str(port), port_file],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=child_env)
        deadline = time.monotonic() + timeout_s
        while not os.path.exists(port_file) or not open(port_file).read().strip():
            if proc.poll() is not None:
                raise RuntimeError(f"local runtime exited: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
            if time.monotonic() > deadline:
                proc.kill()
                raise TimeoutError("local runtime did not start")
            time.sleep(0.05)
        bound = int(open(port_file).read().strip())
        os.unlink(port_file)
        return cls(f"http://127.0.0.1:{bound}", proc)

    def boto3_client(self, service: str, **kwargs: Any) -> Any:
        return runtime_client(self.endpoint_url, service, **kwargs)

    def request_count(self, service: str, component: str | None = None) -> int:
        from lightmetrics.local.function_host import COUNTS_PATH

        with urllib.request.urlopen(self.endpoint_url + COUNTS_PATH, timeout=10) as resp:
            counts = json.loads(resp.read())
        return int(counts.get(f"{service}:{component}" if component else service, 0))

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except Exception:
                self.process.kill()


def _serve_main(argv: list[str]) -> None:
    """``python -m lightmetrics.local.server PORT [PORT_FILE]``: serve until SIGTERM/SIGINT."""
    import signal

    from lightmetrics.local.environment import QUIET_POWERTOOLS

    port = int(argv[0]) if argv else DEFAULT_PORT
    runtime = LocalRuntime(port=port).start()
    # Functions hosted here (Step Functions Lambda tasks) talk to this server, whatever the
    # parent's environment pointed at.
    os.environ.update({"AWS_ENDPOINT_URL": runtime.endpoint_url, "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION})
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    for name, value in QUIET_POWERTOOLS.items():
        os.environ.setdefault(name, value)
    if len(argv) > 1:
        with open(argv[1] + ".tmp", "w") as fh:
            fh.write(str(runtime.port))
        os.replace(argv[1] + ".tmp", argv[1])
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        while not stop.wait(0.5):
            pass
    finally:
        runtime.stop()
    exit_served_process(0)


def exit_served_process(code: int) -> None:
    """End a serving process once it has stopped serving, skipping the interpreter's finalization:
    tearing down moto's thousands of modules and objects took 3 s idle and more than the demo's
    10 s grace under load (then the process was killed). Nothing of it outlives the process."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def env_exports(runtime: Any, config_values: Mapping[str, Any], *,
                credentials: Mapping[str, str] | None = None) -> list[str]:
    """Shell ``export`` lines pointing boto3/the AWS CLI at ``runtime``, plus ``LM_*`` settings.

    Keys without the ``LM_`` prefix get it (``bucket`` -> ``LM_BUCKET``); None values are skipped.
    ``credentials`` (botocore's arguments: the operators' role's) sign instead of the deployer's key.

    >>> class RT: endpoint_url = "http://127.0.0.1:4566"; region = "us-east-1"
    >>> env_exports(RT(), {"LM_BUCKET": "b", "prefix": "a b/"})[-1]
    "export LM_PREFIX='a b/'"
    """
    lines = [
        f"export AWS_ENDPOINT_URL={shlex.quote(runtime.endpoint_url)}",
        f"export AWS_DEFAULT_REGION={shlex.quote(getattr(runtime, 'region', REGION))}",
        "export AWS_ACCESS_KEY_ID=testing",
        "export AWS_SECRET_ACCESS_KEY=testing",
    ]
    if credentials:
        lines[2:] = [f"export {name}={shlex.quote(credentials[arg])}" for name, arg in (
            ("AWS_ACCESS_KEY_ID", "aws_access_key_id"), ("AWS_SECRET_ACCESS_KEY", "aws_secret_access_key"),
            ("AWS_SESSION_TOKEN", "aws_session_token"))]
    for key, value in config_values.items():
        if value is None:
            continue
        name = key.upper() if key.upper().startswith("LM_") else f"LM_{key.upper()}"
        if not name.replace("_", "").isalnum() or not name.isascii():
            raise ValueError(f"not an environment variable name: {name!r}")
        lines.append(f"export {name}={shlex.quote(str(value))}")
    return lines


if __name__ == "__main__":
    import sys as _sys

    _serve_main(_sys.argv[1:])
