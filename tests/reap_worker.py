"""One OS process of the reap crash test: drive a reap until ``LM_CRASH_AT`` kills the process.

Usage: reap_worker.py BUCKET CLOCK_NS INPUT_JSON EVENT_FILE
Before every task it writes ``{"next", "event", "clock_ns"}`` to EVENT_FILE, so that the parent
can retry the task the kill interrupted — what Step Functions does when a Lambda dies.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from conftest import FAST  # noqa: E402
from reap_support import drive, world_settings  # noqa: E402

from lightmetrics.composition.services import work_context  # noqa: E402
from lightmetrics.harness.testing.crashes import killed_at_from_env  # noqa: E402
from lightmetrics.local.hosting import install_from_env  # noqa: E402
from lightmetrics.protocol.clock import FrozenClock  # noqa: E402
from lightmetrics.reaps import Reaper  # noqa: E402


def main() -> None:
    bucket, clock_ns, inp, event_file = sys.argv[1:5]
    install_from_env()  # a test process is a local host: the world's zero grace is allowed
    settings = world_settings(bucket)
    clock = FrozenClock(int(clock_ns))
    ctx = work_context(settings, clock=clock, policy=FAST, component="reap-worker")

    def record(nxt: str, event: dict) -> None:  # type: ignore[type-arg]
        with open(event_file, "w", encoding="utf-8") as f:
            json.dump({"next": nxt, "event": event, "clock_ns": clock.now_ns()}, f)

    with killed_at_from_env():
        drive(Reaper(ctx, settings), json.loads(inp), clock, before_task=record)


if __name__ == "__main__":
    main()
