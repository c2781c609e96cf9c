"""``lmctl conflicts list|show|resolve`` and ``lmctl denylist [list|remove]``: identity conflicts and
denials, on the admin API's core.

Exit codes (README, "Exit codes"): 0 ok; 1 ``list`` found unresolved conflicts (so scripts can gate on it);
2 invalid input, unknown conflict (with the closest ids), an id start that several conflicts share
(naming them), a conflict that is already resolved (resolutions are
write-once: nothing is overwritten), an identity that is not denied, or a denial or lift that was
not confirmed; 4 AWS unavailable (retry).

Decisions that change who may send (``--deny-identity``, ``denylist remove``) ask for confirmation
on a terminal; scripts pass ``--yes`` (without a terminal and without ``--yes`` they exit 2).

Example::

    $ lmctl conflicts list --status unresolved          # short ids; --output wide: whole ids and hashes
    $ lmctl conflicts resolve 1546eadc --accept-existing \\
          --reason "agent replayed a stale spool after a disk restore"
    $ lmctl denylist remove --agent agent-a --boot boot-1 --reason "host re-imaged, not a clone" --yes
"""

from __future__ import annotations

import sys
from typing import Any

import click

from lightmetrics.cli.options import (
    config_options,
    configured_context,
    exit_for_error,
    json_option,
    operator_name,
    output_option,
)
from lightmetrics.cli.output import EXIT_OK, EXIT_USAGE, EXIT_VIOLATIONS, console, emit_json, fail, grid, kv_table
from lightmetrics.cli.short_ids import closest, compact_grid, is_short_id, shortest_unique_prefixes
from lightmetrics.deployment.settings import Settings
from lightmetrics.protocol.clock import utc_text


def _registry(settings: Settings, as_json: bool):  # type: ignore[no-untyped-def]
    from lightmetrics.acceptance.conflicts import ConflictRegistry

    ctx = configured_context(settings, as_json=as_json, component="admin")
    return ConflictRegistry(ctx.store, ctx.codec, ctx.blockers.table, clock=ctx.clock, policy=ctx.policy)


def _run(fn: Any, as_json: bool) -> Any:
    """Map the core's typed errors onto exit codes."""
    from botocore.exceptions import BotoCoreError, ClientError

    from lightmetrics.acceptance.conflict_records import (
        ConflictAlreadyResolved,
        ConflictNotFound,
        ConflictStoreUnavailable,
        InvalidConflictId,
        InvalidResolution,
    )
    from lightmetrics.acceptance.denylist import InvalidLift, NotDenied
    from lightmetrics.protocol.object_store import StoreAccessError, TransientStoreError

    try:
        return fn()
    except ConflictAlreadyResolved as exc:
        if as_json:
            emit_json({"status": "already_resolved", "reason": str(exc), "exit_code": EXIT_USAGE,
                       "record": exc.record.model_dump(mode="json", by_alias=True)})
            sys.exit(EXIT_USAGE)
        fail(str(exc), EXIT_USAGE)
    except ConflictNotFound as exc:
        fail(f"{exc.args[0]}; see `lmctl conflicts list`", EXIT_USAGE, as_json=as_json)
    except (InvalidConflictId, InvalidResolution, InvalidLift, NotDenied) as exc:
        fail(str(exc), EXIT_USAGE, as_json=as_json)
    except (ConflictStoreUnavailable, TransientStoreError, StoreAccessError, BotoCoreError, ClientError) as exc:
        exit_for_error(exc, "unavailable", as_json=as_json)  # a missing bucket or table: exit 2, naming it


def _conflict_id(registry: Any, text: str) -> str:
    """The whole conflict id ``text`` names: itself, the one id it is the start of (one S3 LIST,
    :meth:`ConflictRegistry.complete_id`), or — hex without dots — the one conflict among the newest
    1000 in the registry (what ``lmctl conflicts list --limit 1000`` reads) whose submitted sha256
    starts with it (the table's short id). Several: InvalidConflictId naming them; none:
    ConflictNotFound with the closest ids (difflib)."""
    from lightmetrics.acceptance.conflict_records import CONFLICT_ID_RE, ConflictNotFound, InvalidConflictId

    text = (text or "").strip()
    if CONFLICT_ID_RE.match(text) or "." in text or "/" in text or not is_short_id(text):
        return str(registry.complete_id(text))
    text = text.lower()
    known = registry.list(limit=1000).items
    matches = {e.conflict_id for e in known if e.submitted_frame_sha256.startswith(text)}
    try:
        matches.add(registry.complete_id(text))
    except ConflictNotFound:
        pass
    except InvalidConflictId:  # the start of several whole ids
        if not matches:
            raise
        raise InvalidConflictId(f"{text!r} is the start of several conflict ids and short ids; give more of it") from None
    if len(matches) == 1:
        return str(matches.pop())
    if matches:
        raise InvalidConflictId(f"{text!r} is the start of several conflict ids: {', '.join(sorted(matches))}; "
                                f"give more of it")
    by_short = {e.submitted_frame_sha256[:len(text)]: e.conflict_id for e in known}
    close = [by_short[c] for c in closest(text, by_short)] or closest(text, (e.conflict_id for e in known))
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    raise ConflictNotFound(f"no conflict id starts with {text!r}{hint}")


def confirm(action: str, yes: bool, as_json: bool) -> None:
    """Ask before a change of who may send; ``--yes`` answers for scripts. No terminal, no ``--yes``: exit 2."""
    if yes:
        return
    if not sys.stdin.isatty():
        fail(f"not confirmed: {action}; pass --yes to confirm (no terminal to ask on)", EXIT_USAGE, as_json=as_json)
    if not click.confirm(f"{action}?", default=False, err=True):  # stderr: stdout stays one JSON document
        fail("not confirmed; nothing was changed", EXIT_USAGE, as_json=as_json)


def _scope(agent_id: str, boot_id: str | None) -> str:
    return f"every boot of agent {agent_id!r}" if boot_id is None else f"agent {agent_id!r} boot {boot_id!r}"


@click.group()
def conflicts() -> None:
    """Identity conflicts: the same identity submitted with different content (list, show, resolve)."""


@conflicts.command("list")
@click.option("--agent", default=None, help="Only this agent id.")
@click.option("--status", "status", type=click.Choice(["all", "unresolved", "resolved"]), default="all",
              show_default=True)
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 1000))
@click.option("--next-token", default=None, help="Continue after a previous page (printed with --json).")
@output_option
@config_options
@json_option
def conflicts_list(agent: str | None, status: str, limit: int, next_token: str | None, output: str,
                   settings: Settings, as_json: bool) -> None:
    """Conflicts, newest first (exit 1 if any listed conflict is unresolved). The id column is a short
    id (the start of the submitted sha256) `show` and `resolve` take; ``--output wide``: ids and hashes whole."""
    registry = _registry(settings, as_json)
    page = _run(lambda: registry.list(agent=agent, status=status, limit=limit, next_token=next_token), as_json)
    unresolved = sum(1 for e in page.items if e.resolution == "unresolved")
    if as_json:
        emit_json({**page.to_json(), "unresolved": unresolved})
    else:
        if output == "wide":
            table = grid(f"identity conflicts ({unresolved} unresolved)",
                         ["id", "agent/boot", "seq", "accepted sha256", "submitted sha256", "first seen",
                          "collectors", "resolution"],
                         [(e.conflict_id, f"{e.agent_id}/{e.boot_id}", f"{e.seq_start}-{e.seq_end}",
                           e.accepted_frame_sha256, e.submitted_frame_sha256, utc_text(e.first_seen_unix_ns),
                           ", ".join(e.collectors), e.resolution) for e in page.items])
        else:
            short = shortest_unique_prefixes({e.conflict_id: e.submitted_frame_sha256 for e in page.items})
            table = compact_grid(f"identity conflicts ({unresolved} unresolved)",
                                 [("id", None), ("agent/boot", None), ("seq", 23), ("first seen", None),
                                  ("resolution", None)],
                                 [(short[e.conflict_id], f"{e.agent_id}/{e.boot_id}", f"{e.seq_start}-{e.seq_end}",
                                   utc_text(e.first_seen_unix_ns), e.resolution) for e in page.items],
                                 fill="agent/boot", elide_fill=True)
        console.print(table)
        if page.next_token:
            console.print(f"more: --next-token {page.next_token}")
        if unresolved:
            console.print("inspect: lmctl conflicts show ID  (ID = the id column, or the start of a whole id)")
            # one line per decision: each takes --reason, and each line fits 100 columns (issue 27 items 4, 7)
            console.print("decide: lmctl conflicts resolve ID --accept-existing --reason TEXT")
            console.print("    or: lmctl conflicts resolve ID --deny-identity --reason TEXT")
    sys.exit(EXIT_VIOLATIONS if unresolved else EXIT_OK)


@conflicts.command("show")
@click.argument("conflict_id")
@config_options
@json_option
def conflicts_show(conflict_id: str, settings: Settings, as_json: bool) -> None:
    """One conflict from its evidence in S3: both hashes, both blobs, the accepted record, the decision.
    CONFLICT_ID: the id column of `lmctl conflicts list` (a short id), or the start of a whole id that
    no other conflict's id starts with."""
    registry = _registry(settings, as_json)
    detail = _run(lambda: registry.show(_conflict_id(registry, conflict_id)), as_json)
    if as_json:
        emit_json(detail.to_json())
        return
    e = detail.entry
    rows: list[tuple[str, Any]] = [
        ("id", e.conflict_id), ("agent / boot", f"{e.agent_id} / {e.boot_id}"),
        ("sequence range", f"{e.seq_start}-{e.seq_end}"), ("first seen", utc_text(e.first_seen_unix_ns)),
        ("accepted manifest", e.accepted_manifest_key), ("accepted sha256", e.accepted_frame_sha256),
        ("accepted blob", e.accepted_raw_blob_key), ("accepted by collector", e.accepted_collector_id),
        ("submitted sha256", e.submitted_frame_sha256), ("submitted blob", e.submitted_raw_blob_key),
        ("submitted bytes", e.submitted_frame_bytes), ("observed by collector", e.observed_by_collector_id),
        ("evidence", e.quarantine_key), ("resolution", e.resolution),
    ]
    if detail.record is not None:
        r = detail.record
        rows += [("resolved by", r.resolved_by), ("resolved at", utc_text(r.resolved_at_unix_ns)), ("reason", r.reason),
                 ("denylist entries", ", ".join(r.denylist_entries) or "-"), ("resolution record", detail.resolution_key)]
    if detail.repaired_index:
        rows.append(("registry", "index item was missing or stale; repaired from S3"))
    console.print(kv_table("identity conflict", rows))


@conflicts.command("resolve")
@click.argument("conflict_id")
@click.option("--accept-existing", is_flag=True,
              help="The accepted record stands; the agent drops its parked batch on its next retry.")
@click.option("--deny-identity", is_flag=True,
              help="Deny the agent/boot: ingest refuses it (403) within LM_DENYLIST_TTL_S (asks to confirm).")
@click.option("--whole-agent", is_flag=True, help="With --deny-identity: deny every boot of the agent.")
@click.option("--reason", required=True, help="Why (kept in the write-once resolution record).")
@click.option("--yes", is_flag=True, help="Confirm --deny-identity without a prompt (scripts).")
@config_options
@json_option
def conflicts_resolve(conflict_id: str, accept_existing: bool, deny_identity: bool, whole_agent: bool, reason: str,
                      yes: bool, settings: Settings, as_json: bool) -> None:
    """Record the operator's decision once (exit 2 if the conflict was already resolved).
    CONFLICT_ID: the id column of `lmctl conflicts list` (a short id), or the start of a whole id that
    no other conflict's id starts with."""
    if accept_existing and deny_identity:
        fail("choose one decision: --accept-existing or --deny-identity, not both; nothing was changed",
             EXIT_USAGE, as_json=as_json)
    if not (accept_existing or deny_identity):
        fail("choose --accept-existing or --deny-identity", EXIT_USAGE, as_json=as_json)
    decision = "deny_identity" if deny_identity else "accept_existing"
    registry = _registry(settings, as_json)
    conflict_id = _run(lambda: _conflict_id(registry, conflict_id), as_json)  # what `show` takes too
    if deny_identity:
        from lightmetrics.acceptance.conflict_records import parse_conflict_id

        ident, _ = _run(lambda: parse_conflict_id(conflict_id, registry.codec), as_json)
        confirm(f"Deny {_scope(ident.agent_id, None if whole_agent else ident.boot_id)} (ingest answers 403 "
                f"within LM_DENYLIST_TTL_S)", yes, as_json)
    record = _run(lambda: registry.resolve(conflict_id, decision, reason=reason, who=operator_name(),
                                           whole_agent=whole_agent), as_json)
    if as_json:
        emit_json({"status": "resolved", "record": record.model_dump(mode="json", by_alias=True)})
    else:
        console.print(kv_table(f"[green]resolved: {record.resolution}[/]", [
            ("id", record.conflict_id), ("resolved by", record.resolved_by),
            ("resolved at", utc_text(record.resolved_at_unix_ns)), ("reason", record.reason),
            ("denylist entries", ", ".join(record.denylist_entries) or "-"),
        ]))


def _denylist_store(settings: Settings, as_json: bool):  # type: ignore[no-untyped-def]
    from lightmetrics.acceptance.denylist import DenylistStore
    from lightmetrics.composition.services import control_table

    try:
        return DenylistStore(control_table(settings))
    except Exception as exc:
        exit_for_error(exc, "cannot reach AWS", as_json=as_json)


def _list_denylist(settings: Settings, as_json: bool, output: str = "table") -> None:
    store = _denylist_store(settings, as_json)
    entries, lifts = _run(lambda: (store.list(), store.lifts()), as_json)
    if as_json:
        emit_json({"denylist": [e.to_json() for e in entries], "lifted": [lift.to_json() for lift in lifts]})
        return
    if output == "wide":
        console.print(grid("denylist", ["entry", "agent", "boot", "who", "when", "reason", "conflict"],
                           [(e.sk, e.agent_id, e.boot_id or "(every boot)", e.who, utc_text(e.at_unix_ns), e.reason,
                             e.conflict_id or "") for e in entries]))
        if lifts:
            console.print(grid("lifted denials", ["entry", "agent", "boot", "denied by", "lifted by", "lifted",
                                                  "reason"],
                               [(x.entry, x.agent_id, x.boot_id or "(every boot)", x.denied_by, x.lifted_by,
                                 utc_text(x.lifted_at_unix_ns), x.reason) for x in lifts]))
        return
    # 100 columns: agent/boot keeps its start and end, the conflict its short id (`conflicts show` takes it)
    console.print(compact_grid("denylist", [("agent/boot", None), ("who", 16), ("when", None), ("reason", 20),
                                            ("conflict", None)],
                               [(f"{e.agent_id}/{e.boot_id or '(every boot)'}", e.who, utc_text(e.at_unix_ns),
                                 e.reason, _conflict_short(e.conflict_id)) for e in entries],
                               fill="agent/boot", elide_fill=True))
    if lifts:
        console.print(compact_grid("lifted denials", [("agent/boot", None), ("denied by", 14), ("lifted by", 14),
                                                      ("lifted", None), ("reason", 20)],
                                   [(f"{x.agent_id}/{x.boot_id or '(every boot)'}", x.denied_by, x.lifted_by,
                                     utc_text(x.lifted_at_unix_ns), x.reason) for x in lifts],
                                   fill="agent/boot", elide_fill=True))
    console.print("whole ids and every column: lmctl denylist --output wide")


def _conflict_short(conflict_id: str | None) -> str:
    """The start of a conflict id's submitted sha256 (its last dotted part): a short id `show` takes."""
    return conflict_id.rsplit(".", 1)[-1][:12] if conflict_id else ""


@click.group("denylist", invoke_without_command=True)
@output_option
@config_options
@json_option
@click.pass_context
def denylist_cmd(ctx: click.Context, output: str, settings: Settings, as_json: bool) -> None:
    """Identities an operator denied (ingest answers them 403), and lifted denials; `remove` lifts one."""
    if ctx.invoked_subcommand is None:
        _list_denylist(settings, as_json, output)


@denylist_cmd.command("list")
@output_option
@config_options
@json_option
def denylist_list(output: str, settings: Settings, as_json: bool) -> None:
    """The denylist entries and the audit records of lifted denials (same as plain `lmctl denylist`)."""
    _list_denylist(settings, as_json, output)


@denylist_cmd.command("remove")
@click.option("--agent", "agent_id", required=True, help="The denied agent id.")
@click.option("--boot", "boot_id", default=None, help="Lift the denial of this boot.")
@click.option("--whole-agent", is_flag=True, help="Lift the denial of every boot of the agent (entry <agent-hex>#*).")
@click.option("--reason", required=True, help="Why (kept in the write-once lift record).")
@click.option("--yes", is_flag=True, help="Confirm without a prompt (scripts).")
@config_options
@json_option
def denylist_remove(agent_id: str, boot_id: str | None, whole_agent: bool, reason: str, yes: bool,
                    settings: Settings, as_json: bool) -> None:
    """Lift one denial (audited: a write-once lift record, then the entry is deleted).

    Ingest stops answering 403 within LM_DENYLIST_TTL_S. Exit 2 if the selection is ambiguous, the
    reason empty, the agent/boot not denied, or the lift not confirmed.
    """
    from lightmetrics.acceptance.denylist import InvalidLift, lift_target, operator_reason

    _run(lambda: (lift_target(agent_id, boot_id, whole_agent), operator_reason(reason, InvalidLift)), as_json)
    store = _denylist_store(settings, as_json)
    confirm(f"Lift the denial of {_scope(agent_id, None if whole_agent else boot_id)} (ingest accepts it again "
            f"within LM_DENYLIST_TTL_S)", yes, as_json)
    lift = _run(lambda: store.remove(agent_id, boot_id, whole_agent=whole_agent, who=operator_name(), reason=reason), as_json)
    if as_json:
        emit_json({"status": "lifted", "lift": lift.to_json()})
    else:
        console.print(kv_table("[green]denial lifted[/]", [
            ("entry", lift.entry), ("agent / boot", f"{lift.agent_id} / {lift.boot_id or '(every boot)'}"),
            ("denied by", lift.denied_by), ("denied at", utc_text(lift.denied_at_unix_ns)),
            ("denial reason", lift.denied_reason), ("conflict", lift.conflict_id or "-"),
            ("lifted by", lift.lifted_by), ("lifted at", utc_text(lift.lifted_at_unix_ns)), ("reason", lift.reason),
        ]))


__all__ = ["confirm", "conflicts", "denylist_cmd"]
