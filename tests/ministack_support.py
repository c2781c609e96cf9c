"""MiniStack, the suite's second backend: its own S3, DynamoDB and Step Functions in pure Python
(no moto inside), run as a child process on a loopback port, one per test session.

It is a separate process (not a thread like moto's server): MiniStack keeps its state in module
globals and serves through hypercorn's asyncio loop, and a process of its own keeps it off this
process's GIL. docs/reliability.md, "Backends the suite runs on", lists what runs where.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from lightmetrics.local.server import runtime_client

#: The services the suite uses on MiniStack (fewer handlers, faster start).
SERVICES = "s3,dynamodb,stepfunctions,secretsmanager,sqs"

#: MiniStack's own venv (`make ministack`, which `make test` runs): it pins botocore exactly, so it
#: cannot share the project's venv; LM_MINISTACK_PYTHON names another interpreter that has it.
MINISTACK_PYTHON = Path(os.environ.get("LM_MINISTACK_PYTHON")
                        or Path(__file__).resolve().parents[1] / ".venv-ministack" / "bin" / "python")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MiniStackRuntime:
    """A running MiniStack server with the part of :class:`LocalRuntime`'s interface storage tests
    use: ``endpoint_url`` and ``boto3_client``."""

    name = "ministack"

    def __init__(self, log_dir: Path) -> None:
        self.port = _free_port()
        self.host = "127.0.0.1"
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = log_dir / "ministack.log"

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> MiniStackRuntime:
        if not MINISTACK_PYTHON.is_file():
            raise RuntimeError(f"MiniStack's interpreter {MINISTACK_PYTHON} is missing: run `make ministack` "
                               "(make test installs it) or set LM_MINISTACK_PYTHON")
        env = dict(os.environ, GATEWAY_PORT=str(self.port), SERVICES=SERVICES, LOG_LEVEL="WARNING",
                   MINISTACK_HOST=self.host, S3_PERSIST="0")
        with open(self.log_path, "wb") as log:
            # stdout/stderr to a file: a child holding the test runner's pipes would outlive it
            self.process = subprocess.Popen(
                [str(MINISTACK_PYTHON), "-m", "hypercorn", "ministack.app:app", "--bind", f"{self.host}:{self.port}",
                 "--log-level", "WARNING"], env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"MiniStack exited with {self.process.returncode}: {self.log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.endpoint_url + "/_ministack/health", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"MiniStack did not answer on {self.endpoint_url} within {timeout_s}s")

    def boto3_client(self, service: str, **kwargs: Any) -> Any:
        return runtime_client(self.endpoint_url, service, **kwargs)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None
