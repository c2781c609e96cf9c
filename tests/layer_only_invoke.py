"""Run every deployed handler the way Lambda does, with only the layer on ``sys.path``.

``python -I -S tests/layer_only_invoke.py PLAN.json RESULT.json`` — started by
``tests/test_invariant_environment.py`` with no site-packages: ``sys.path`` is the stdlib plus the
plan's ``sandbox`` directory (symlinks to the runtime dependencies, ``lightmetrics`` and
``functions``). This file imports nothing outside the stdlib itself; the plan says which
handlers to call with which events (``calls``) and which state machines to drive (``walks``,
``reaps``), the result lists every answer (or error) and what ended up imported.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import time
import traceback
import uuid
from typing import Any


class Context:
    """The attributes of the Lambda context object that handlers and Powertools read."""

    def __init__(self, name: str) -> None:
        self.function_name = name
        self.function_version = "$LATEST"
        self.invoked_function_arn = f"arn:aws:lambda:us-east-1:123456789012:function:{name}"
        self.memory_limit_in_mb = 512
        self.aws_request_id = str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{name}"
        self.log_stream_name = "sandbox"

    def get_remaining_time_in_millis(self) -> int:
        return 60_000


def call(results: list[dict[str, Any]], module: str, label: str, event: Any) -> Any:
    entry: dict[str, Any] = {"module": module, "label": label}
    results.append(entry)
    started = time.monotonic()
    try:
        handler = importlib.import_module(module).handler
        entry["result"] = handler(event, Context(module.split(".")[1]))
        entry["ok"] = True
        return entry["result"]
    except BaseException as exc:  # noqa: BLE001 - reported to the test, which decides
        entry.update(ok=False, error=f"{type(exc).__module__}.{type(exc).__name__}: {exc}",
                     traceback=traceback.format_exc()[-3000:])
        return None
    finally:
        entry["seconds"] = round(time.monotonic() - started, 3)


def drive_walk(results: list[dict[str, Any]], walk: dict[str, Any]) -> None:
    """The bootstrap walk's ASL loop: Begin, (Plan, Pages)*, then Continue or Finish."""
    out = call(results, "functions.walk_begin.app", "begin", {"input": walk["input"], "execution_arn": walk["execution_arn"],
                                                              "state_machine_arn": walk["state_machine_arn"]})
    for _ in range(20):
        if not out:
            return
        out = call(results, "functions.walk_plan.app", "plan", {"walk": out["walk"]})
        if not out:
            return
        if out.get("next") == "finish":
            call(results, "functions.walk_end.app", "finish", {"walk": out["walk"], "outcome": "finished"})
            return
        if out.get("next") == "continue":
            call(results, "functions.walk_continue.app", "continue", {"walk": out["walk"]})
            return
        for item in out.get("work") or []:
            call(results, "functions.walk_page.app", "page", {"walk": out["walk"], "item": item, "retry_count": 0})


def drive_reap(results: list[dict[str, Any]], inp: dict[str, Any], execution_arn: str, machine_arn: str) -> None:
    """The reap's ASL loop: Begin, then Gc/Retention (a Wait goes straight to its task), then Finish
    or Continue (the next execution, which the local runtime runs to its end)."""
    tasks = {"gc": "functions.reap_gc.app", "retention": "functions.reap_retention.app"}
    out = call(results, "functions.reap_begin.app", f"begin {inp['mode']}", {"input": inp, "execution_arn": execution_arn,
                                                                             "state_machine_arn": machine_arn})
    for _ in range(20):
        if not out:
            return
        step = out.get("after") if out.get("next") == "wait" else out.get("next")
        if step == "finish":
            call(results, "functions.reap_end.app", f"finish {inp['mode']}", {"reap": out["reap"], "outcome": "finished"})
            return
        if step == "continue":
            call(results, "functions.reap_continue.app", f"continue {inp['mode']}", {"reap": out["reap"]})
            return
        out = call(results, tasks[step], f"{step} {inp['mode']}", {"reap": out["reap"]})


def main(plan_path: str, result_path: str) -> None:
    with open(plan_path, encoding="utf-8") as fh:
        plan = json.load(fh)
    sys.path.insert(0, plan["sandbox"])
    results: list[dict[str, Any]] = []
    for c in plan.get("calls", []):
        call(results, c["module"], c["label"], c["event"])
    for walk in plan.get("walks", []):
        drive_walk(results, walk)
    for inp in plan.get("reaps", []):
        drive_reap(results, inp, plan["reap_execution_arn"], plan.get("reap_state_machine_arn", ""))
    admin = plan.get("admin")
    if admin:  # every admin route; show and resolve need a conflict id from the listing
        listed = call(results, "functions.admin.app", "GET /conflicts", admin["list"])
        conflicts = json.loads(listed["body"]).get("conflicts", []) if listed and listed.get("body") else []
        cid = conflicts[0]["conflict_id"] if conflicts else "no-conflict-listed"
        for route in admin["routes"]:
            event = json.loads(json.dumps(route["event"]).replace("REPLACE-WITH-CONFLICT-ID", cid))
            call(results, "functions.admin.app", route["label"], event)
    importable = {name: importlib.util.find_spec(name) is not None for name in plan.get("absent", [])}
    with open(result_path, "w", encoding="utf-8") as fh:
        json.dump({"results": results, "importable": importable, "sys_path": sys.path,
                   "modules": sorted(m for m in sys.modules if m.startswith("lightmetrics"))}, fh, default=str)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
