"""The admin HTTP API (``functions/admin``, a Function URL with IAM auth): conflicts, blockers, status.

Routes (JSON in and out; the same core as ``lmctl conflicts`` / ``blockers list`` / ``status``):

=======================================  ==========================================================
``GET  /conflicts``                      ``?agent=A&status=all|unresolved|resolved&limit=N&next_token=T``
``GET  /conflicts/{id}``                 evidence, resolution record, index state
``POST /conflicts/{id}/resolve``         ``{"resolution": "accept_existing"|"deny_identity",
                                         "reason": "...", "whole_agent": false}``
``GET  /denylist``                       every denylist entry, and every lifted denial (``lifted``)
``POST /denylist/remove``                lift one denial: ``{"agent_id": "...", "boot_id": "..." |
                                         "whole_agent": true, "reason": "..."}``
``GET  /blockers``                       ``?all=true`` for resumed/resolved/skipped too
``GET  /blockers/{blocker}``             one blocker whole; ``blocker`` as ``lmctl blockers`` takes it
                                         (:mod:`lightmetrics.admin.blocker_ids`), URL-encoded
``GET  /status``                         :func:`lightmetrics.admin.status.system_status`
=======================================  ==========================================================

Bodies are strict (docs/protocol.md §14, A1): every field has exactly its JSON type — a boolean
is ``true`` or ``false``, never ``"false"`` or ``1`` — and an unknown field is refused; a boolean
query parameter is ``true`` or ``false``.

Errors: 400 bad id/resolution/body or a blocker id start several blockers share (``candidates``
names them), 404 unknown conflict, not denied, or no such blocker (``suggestions``: the closest
work keys), 409 already resolved (the
body carries the existing record), 503 S3 did not confirm a write (retry). The caller recorded as
``resolved_by``/``lifted_by`` is the IAM principal that signed the request
(``requestContext.authorizer.iam.userArn``).

Example:
    >>> app = build_resolver(lambda: AdminCore(ctx, settings, queue_depths(ctx.sqs)))  # doctest: +SKIP
    >>> app.resolve(function_url_event, context)                            # doctest: +SKIP
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from aws_lambda_powertools.event_handler import LambdaFunctionUrlResolver, Response, content_types

from lightmetrics.acceptance.conflict_records import (
    ConflictAlreadyResolved,
    ConflictError,
    ConflictNotFound,
    ConflictStoreUnavailable,
    InvalidConflictId,
    InvalidResolution,
)
from lightmetrics.acceptance.conflicts import ConflictRegistry
from lightmetrics.acceptance.denylist import DenylistStore, InvalidLift, NotDenied
from lightmetrics.admin.blocker_ids import AmbiguousBlocker, UnknownBlocker, resolve_work_key
from lightmetrics.deployment.settings import Settings
from lightmetrics.protocol.errors import LightmetricsError
from lightmetrics.protocol.object_store import StoreAccessError, TransientStoreError
from lightmetrics.work.units import WorkContext

if TYPE_CHECKING:
    from lightmetrics.admin.status import StatusQueues


class InvalidRequest(LightmetricsError, ValueError):
    """A body or query parameter of the wrong shape or JSON type (HTTP 400)."""


_JSON_TYPE = {bool: "a JSON boolean (true or false)", str: "a JSON string"}


def json_fields(raw: str | None, fields: dict[str, tuple[type, bool]]) -> dict[str, Any]:
    """The request body as a JSON object checked against ``fields`` (name -> (type, required)).

    No coercion: ``"false"``, ``0`` or ``null`` are not booleans and ``7`` is not a string, and an
    unknown field (a typo such as ``wholeagent``) is refused rather than ignored.
    """
    try:
        body = json.loads(raw or "{}")
    except ValueError:
        raise InvalidRequest("body must be JSON") from None
    if not isinstance(body, dict):
        raise InvalidRequest("body must be a JSON object")
    unknown = sorted(set(body) - set(fields))
    if unknown:
        raise InvalidRequest(f"unknown field(s) {', '.join(unknown)}; expected {', '.join(sorted(fields))}")
    for name, (kind, required) in fields.items():
        if name not in body:
            if required:
                raise InvalidRequest(f"{name} is required")
            continue
        value = body[name]
        exact = type(value) is bool if kind is bool else isinstance(value, kind) and not isinstance(value, bool)
        if not exact:
            raise InvalidRequest(f"{name} must be {_JSON_TYPE[kind]}, got {json.dumps(value)}")
    return body


def query_flag(query: dict[str, str], name: str) -> bool:
    """A boolean query parameter: absent is false; otherwise exactly ``true`` or ``false``."""
    value = query.get(name)
    if value is None:
        return False
    if value not in ("true", "false"):
        raise InvalidRequest(f"query parameter {name} must be true or false, got {value!r}")
    return value == "true"


@dataclass
class AdminCore:
    """What the routes need; built once per process by the handler."""

    ctx: WorkContext
    settings: Settings
    #: the queues' depths status reads (the composition root's, on the context's SQS client)
    queues: StatusQueues

    @property
    def registry(self) -> ConflictRegistry:
        c = self.ctx
        return ConflictRegistry(c.store, c.codec, c.blockers.table, clock=c.clock, policy=c.policy)


def _json(status: int, body: dict[str, Any]) -> Response[str]:
    return Response(status_code=status, content_type=content_types.APPLICATION_JSON,
                    body=json.dumps(body, sort_keys=True, default=str))


def caller_of(event: dict[str, Any]) -> str:
    """The IAM principal that signed the request (Function URL IAM auth puts it in the event)."""
    iam = ((event.get("requestContext") or {}).get("authorizer") or {}).get("iam") or {}
    return str(iam.get("userArn") or iam.get("callerId") or iam.get("accessKey") or "unknown-iam-principal")


def build_resolver(core: Callable[[], AdminCore]) -> LambdaFunctionUrlResolver:
    """The admin routes on Powertools' Function URL resolver; ``core`` is called per request."""
    app = LambdaFunctionUrlResolver()

    def query() -> dict[str, str]:
        return dict(app.current_event.query_string_parameters or {})

    @app.get("/conflicts")
    def list_conflicts() -> Response[str]:
        q = query()
        try:
            limit = int(q.get("limit", "50"))
        except ValueError:
            raise InvalidResolution("limit must be an integer") from None
        page = core().registry.list(agent=q.get("agent") or None, status=q.get("status", "all"), limit=limit,
                                    next_token=q.get("next_token") or None)
        return _json(200, page.to_json())

    @app.get("/conflicts/<conflict_id>")
    def show_conflict(conflict_id: str) -> Response[str]:
        return _json(200, core().registry.show(conflict_id).to_json())

    @app.post("/conflicts/<conflict_id>/resolve")
    def resolve_conflict(conflict_id: str) -> Response[str]:
        body = json_fields(app.current_event.decoded_body,
                           {"resolution": (str, True), "reason": (str, True), "whole_agent": (bool, False)})
        record = core().registry.resolve(
            conflict_id, body["resolution"], reason=body["reason"], who=caller_of(app.current_event.raw_event),
            whole_agent=body.get("whole_agent", False),
        )
        return _json(200, {"status": "resolved", "record": record.model_dump(mode="json", by_alias=True)})

    def denylist_store() -> DenylistStore:
        c = core().ctx
        return DenylistStore(c.blockers.table, c.clock)

    @app.get("/denylist")
    def denylist() -> Response[str]:
        store = denylist_store()
        return _json(200, {"denylist": [e.to_json() for e in store.list()],
                           "lifted": [lift.to_json() for lift in store.lifts()]})

    @app.post("/denylist/remove")
    def remove_denial() -> Response[str]:
        body = json_fields(app.current_event.decoded_body, {"agent_id": (str, True), "boot_id": (str, False),
                                                            "whole_agent": (bool, False), "reason": (str, True)})
        lift = denylist_store().remove(body["agent_id"], body.get("boot_id"), whole_agent=body.get("whole_agent", False),
                                       who=caller_of(app.current_event.raw_event), reason=body["reason"])
        return _json(200, {"status": "lifted", "lift": lift.to_json()})

    @app.get("/blockers")
    def blockers() -> Response[str]:
        show_all = query_flag(query(), "all")
        items = core().ctx.blockers.list(status=None if show_all else "open")
        return _json(200, {"blockers": [b.to_json() for b in items], "open": sum(b.status == "open" for b in items)})

    @app.get("/blockers/<blocker>")
    def show_blocker(blocker: str) -> Response[str]:
        known = core().ctx.blockers.list(status=None)  # one Query: the resolver picks among all, as the CLI's
        work_key = resolve_work_key(known, unquote(blocker))
        return _json(200, next(b for b in known if b.work_key == work_key).to_json())

    @app.get("/status")
    def status() -> Response[str]:
        from lightmetrics.admin.status import system_status

        c = core()
        return _json(200, system_status(c.ctx, c.settings, c.queues))

    @app.exception_handler(ConflictAlreadyResolved)
    def already(exc: ConflictAlreadyResolved) -> Response[str]:
        return _json(409, {"status": "already_resolved", "reason": str(exc),
                           "record": exc.record.model_dump(mode="json", by_alias=True)})

    @app.exception_handler(ConflictNotFound)
    def not_found(exc: ConflictNotFound) -> Response[str]:
        return _json(404, {"status": "not_found", "reason": str(exc.args[0] if exc.args else exc)})

    @app.exception_handler(UnknownBlocker)
    def no_blocker(exc: UnknownBlocker) -> Response[str]:
        return _json(404, {"status": "not_found", "reason": str(exc), "suggestions": exc.suggestions})

    @app.exception_handler(AmbiguousBlocker)
    def several_blockers(exc: AmbiguousBlocker) -> Response[str]:
        return _json(400, {"status": "ambiguous", "reason": str(exc), "candidates": exc.candidates})

    @app.exception_handler(NotDenied)
    def not_denied(exc: NotDenied) -> Response[str]:
        return _json(404, {"status": "not_denied", "reason": str(exc)})

    @app.exception_handler(InvalidConflictId)
    @app.exception_handler(InvalidResolution)
    @app.exception_handler(InvalidLift)
    @app.exception_handler(InvalidRequest)
    def invalid(exc: Exception) -> Response[str]:
        return _json(400, {"status": "invalid", "reason": str(exc)})

    @app.exception_handler(ConflictStoreUnavailable)
    @app.exception_handler(TransientStoreError)
    @app.exception_handler(StoreAccessError)
    def unavailable(exc: Exception) -> Response[str]:
        return _json(503, {"status": "unavailable", "reason": str(exc), "retry_after_s": 2})

    @app.exception_handler(ConflictError)
    def other(exc: ConflictError) -> Response[str]:
        return _json(500, {"status": "error", "reason": str(exc)})

    return app


__all__ = ["AdminCore", "InvalidRequest", "build_resolver", "caller_of", "json_fields", "query_flag"]
