"""Operator commands on background work: ``blockers``, ``status``, ``reconcile``."""

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
from lightmetrics.cli.output import (
    EXIT_OK,
    EXIT_USAGE,
    EXIT_VIOLATIONS,
    console,
    emit_json,
    err_console,
    fail,
    grid,
    kv_table,
)
from lightmetrics.cli.short_ids import compact_grid, hex_token, shortest_unique_prefixes
from lightmetrics.deployment.settings import Settings
from lightmetrics.protocol.clock import utc_text


@click.group()
def blockers() -> None:
    """Work that stopped: list it and decide (retry, resume, skip, redrive)."""


@blockers.command("list")
@click.option("--all", "show_all", is_flag=True, help="Also resumed, resolved and skipped blockers.")
@output_option
@config_options
@json_option
def blockers_list(show_all: bool, output: str, settings: Settings, as_json: bool) -> None:
    """Open blockers (exit 1 if there are any, so scripts can gate on it). The id column is a
    short id every blocker command takes (``--output wide``: the whole work key and every column)."""
    ctx = configured_context(settings, as_json=as_json)
    known = ctx.blockers.list(status=None)  # the one Query `list` always made; short ids are unique among all
    items = [b for b in known if show_all or b.status == "open"]
    open_count = sum(1 for b in items if b.status == "open")
    if as_json:
        emit_json({"blockers": [b.to_json() for b in items], "open": open_count})
    elif output == "wide":
        rows = [(b.work_key, b.status, b.kind, b.object_key, b.attempts, utc_text(b.first_seen_ns), b.reason)
                for b in items]
        console.print(grid(f"blockers ({open_count} open)", ["work key", "status", "kind", "object", "#attempts",
                                                             "first seen", "reason"], rows))
    else:
        short = shortest_unique_prefixes({b.work_key: hex_token(b.work_key) for b in known})
        console.print(compact_grid(f"blockers ({open_count} open)", [("id", None), ("status", 8), ("kind", None),
                                   ("object", 26), ("#", 4), ("reason", None)],
                                   [(short[b.work_key], b.status, b.kind, _tail(b.object_key, 26), b.attempts, b.reason)
                                    for b in items], fill="reason"))
    if items and not as_json:
        console.print("act with: lmctl blockers retry|resume|skip ID  (ID = the id column, or a work key")
        console.print("(WORK_KEY = kind:object, or the object alone when only one blocker is about it)")
    sys.exit(EXIT_VIOLATIONS if open_count else EXIT_OK)


def _tail(text: str, width: int) -> str:
    """The end of an object key (where keys differ), "…" for the rest."""
    return text if len(text) <= width else "…" + text[len(text) - width + 1:]


def _act(fn_name: str, given: tuple[str, ...], settings: Settings, as_json: bool, **kwargs: Any) -> None:
    from lightmetrics.admin import blocker_actions
    from lightmetrics.work.blockers import BlockerNotFound

    work_key = _given_key(given, as_json)
    ctx = configured_context(settings, as_json=as_json)
    try:
        try:
            result = getattr(blocker_actions, fn_name)(ctx, work_key, who=operator_name(), **kwargs)
        except BlockerNotFound:  # a short id, a prefix or the object column of `blockers list`
            work_key = _work_key_of(ctx.blockers.list(status=None), work_key, as_json)
            result = getattr(blocker_actions, fn_name)(ctx, work_key, who=operator_name(), **kwargs)
    except BlockerNotFound:
        fail(f"no blocker {work_key!r}; see `lmctl blockers list`", EXIT_USAGE, as_json=as_json)
    except blocker_actions.ActionError as exc:
        fail(str(exc), EXIT_USAGE, as_json=as_json)
    if as_json:
        emit_json(result.to_json())
    else:
        console.print(kv_table(f"{result.action}: {result.status}", result.to_json().items()))
    sys.exit(EXIT_OK if result.status != "open" else EXIT_VIOLATIONS)


def _given_key(given: tuple[str, ...], as_json: bool) -> str:
    """What names one blocker: one word, or KIND OBJECT as the table's two columns show them."""
    if len(given) > 2:
        fail("give one blocker: an id, a work key (kind:object), an object, or KIND OBJECT", EXIT_USAGE,
             as_json=as_json)
    return ":".join(given)  # KIND OBJECT is the work key kind:object


def _work_key_of(known: list[Any], text: str, as_json: bool) -> str:
    """The work key (``kind:object``) that ``text`` names among the blockers ``list --all`` reads
    (one Query of the blocker partition), by the resolver the admin API uses
    (:func:`lightmetrics.admin.blocker_ids.resolve_work_key`); several or none: exit 2 naming them
    or the closest work keys."""
    from lightmetrics.admin.blocker_ids import AmbiguousBlocker, UnknownBlocker, resolve_work_key

    try:
        return resolve_work_key(known, text)
    except (AmbiguousBlocker, UnknownBlocker) as exc:
        fail(str(exc), EXIT_USAGE, as_json=as_json)


_BLOCKER_HELP = ("BLOCKER: the id column of `lmctl blockers list` (or a longer prefix of it), a work key "
                 "(kind:object) or its start, the object alone when one blocker is about it, or KIND OBJECT.")


@blockers.command("show", epilog=_BLOCKER_HELP)
@click.argument("blocker", nargs=-1, required=True)
@config_options
@json_option
def blockers_show(blocker: tuple[str, ...], settings: Settings, as_json: bool) -> None:
    """One blocker whole: work key, status, reason, payload and audit trail (changes nothing)."""
    from lightmetrics.work.blockers import BlockerNotFound

    ctx = configured_context(settings, as_json=as_json)
    work_key = _given_key(blocker, as_json)
    try:
        found = ctx.blockers.get(work_key)
    except BlockerNotFound:
        found = ctx.blockers.get(_work_key_of(ctx.blockers.list(status=None), work_key, as_json))
    if as_json:
        emit_json(found.to_json())
    else:
        console.print(kv_table("blocker", found.to_json().items()))


@blockers.command("retry", epilog=_BLOCKER_HELP)
@click.argument("blocker", nargs=-1, required=True)
@config_options
@json_option
def blockers_retry(blocker: tuple[str, ...], settings: Settings, as_json: bool) -> None:
    """Run the work now against live state; resolves the blocker on success (exit 1 if still failing)."""
    _act("retry", blocker, settings, as_json)


@blockers.command("resume", epilog=_BLOCKER_HELP)
@click.argument("blocker", nargs=-1, required=True)
@config_options
@json_option
def blockers_resume(blocker: tuple[str, ...], settings: Settings, as_json: bool) -> None:
    """Clear the blocker and its retry budget; the worker tries again (queued work is re-sent)."""
    _act("resume", blocker, settings, as_json)


@blockers.command("skip", epilog=_BLOCKER_HELP)
@click.argument("blocker", nargs=-1, required=True)
@click.option("--reason", required=True, help="Why it is safe to skip (kept in the audit trail).")
@config_options
@json_option
def blockers_skip(blocker: tuple[str, ...], reason: str, settings: Settings, as_json: bool) -> None:
    """Stop working on it; audited with who, when and why."""
    _act("skip", blocker, settings, as_json, reason=reason)


@blockers.command("redrive")
@config_options
@json_option
def blockers_redrive(settings: Settings, as_json: bool) -> None:
    """Send every open DLQ blocker's message back to its queue."""
    from lightmetrics.admin.blocker_actions import redrive

    results = redrive(configured_context(settings, as_json=as_json), who=operator_name())
    if as_json:
        emit_json({"redriven": [r.to_json() for r in results]})
    else:
        console.print(grid("redriven", ["work key", "detail"], [(r.work_key, r.detail) for r in results]))


@click.command("status")
@config_options
@json_option
def status_cmd(settings: Settings, as_json: bool) -> None:
    """Queue and DLQ depths (the reconciler's shards queue's too), reconciler checkpoint and lag,
    open blockers, completeness watermarks, and what is stuck, one line each. Exit 1 if anything is
    stuck (a blocker, a dead letter of an index queue, a reconciler shard that never ran, failed or
    stopped, a lag above the alarm's, a failed walk or reap, a retention hour that cannot finish:
    docs/protocol.md §12 R9), 0 if nothing is; 4 if AWS is unreachable, 2 for invalid configuration."""
    from rich.markup import escape

    from lightmetrics.admin.status import system_status
    from lightmetrics.composition.services import queue_depths

    ctx = configured_context(settings, as_json=as_json)
    try:
        info = system_status(ctx, settings, queue_depths(ctx.sqs))
    except Exception as exc:
        exit_for_error(exc, "cannot read status", as_json=as_json)
    stuck = not info.pop("ok")
    depths, open_blockers = info["queues"], info["open_blockers"]
    if as_json:
        emit_json({**info, "ok": not stuck})
    else:
        console.print(grid("queues", ["queue", "#messages"], depths.items()))
        if info["shard_queues"]:  # no index queue: its dead letters are no cause (a shard's checkpoint says)
            console.print(grid("reconciler shards queue", ["queue", "#messages", "#dead letters"],
                               [(n, q["messages"], q["dead_letters"]) for n, q in info["shard_queues"].items()]))
        console.print(kv_table("reconciler", info["reconciler"].items()))
        console.print(kv_table("completeness watermarks (W)", ((k, v or "(no clean full walk yet)")
                                                                for k, v in info["watermarks"].items())))
        console.print(f"open blockers: {open_blockers}")
        console.print(f"unresolved identity conflicts: {info['unresolved_conflicts']}  (lmctl conflicts list)")
        for cause in info["causes"]:  # escaped: an error recorded by a job may hold [brackets]
            console.print(f"[bold red]stuck:[/] {escape(cause)}")
        if not stuck:
            console.print("[green]ok: nothing is stuck[/]")
    sys.exit(EXIT_VIOLATIONS if stuck else EXIT_OK)


class _RunByDefault(click.Group):
    """``lmctl reconcile [--shard I]`` runs (the ``run`` subcommand); ``lmctl reconcile plan`` plans."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in ctx.help_option_names):
            args = ["run", *args]
        return super().parse_args(ctx, args)


@click.group("reconcile", cls=_RunByDefault)
def reconcile_cmd() -> None:
    """Run the steady-state reconciler now (`lmctl reconcile [--shard I]`, what the schedules run),
    or plan how its shards split the hours (`lmctl reconcile plan`)."""


def _total(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Several shards' reports as one: sums, and the slowest shard's checkpoint (R8)."""
    from collections import Counter

    from lightmetrics.protocol.keys import UtcHour

    def hour_key(report: dict[str, Any]) -> tuple[int, int]:
        after = report["checkpoint_after"]
        return (UtcHour.parse(after).start_unix_s if after and after != "-" else 0, report["shard"])

    slowest = min(reports, key=hour_key)
    outcomes: Counter[str] = Counter()
    for r in reports:
        outcomes.update(r["outcomes"])
    return {"shards": reports, "slowest_shard": slowest["shard"], "checkpoint_after": slowest["checkpoint_after"],
            "lag_s": slowest["lag_s"], "outcomes": dict(outcomes),
            "unowned_ranges": [f"shard {r['shard']}: {u}" for r in reports for u in r["unowned_ranges"]],
            **{k: sum(r[k] for r in reports) for k in ("entries", "verified_earlier", "list_pages", "blob_hours_listed",
                                                       "blob_heads")}}


@reconcile_cmd.command("run")
@click.option("--shard", type=int, default=None,
              help="Run only this shard (0 to LM_RECONCILE_SHARDS - 1); default: every shard, one after another.")
@config_options
@json_option
def reconcile_run(shard: int | None, settings: Settings, as_json: bool) -> None:
    """Run one steady-state reconcile pass now: every shard one after another, or --shard I.
    Exit 1 if an entry is BLOCKED or an hour's plan has ranges without a shard."""
    from botocore.exceptions import BotoCoreError, ClientError

    from lightmetrics.composition.services import queue_probe
    from lightmetrics.derived.reconcile import Reconciler
    from lightmetrics.derived.reconcile_state import ShardError, UnownedRangesError, check_shard
    from lightmetrics.protocol.errors import LightmetricsError

    try:
        shards = [check_shard(shard, settings.reconcile_shards)] if shard is not None else list(
            range(settings.reconcile_shards))
    except ShardError as exc:
        fail(f"--shard: {exc}", EXIT_USAGE, as_json=as_json)
    ctx = configured_context(settings, as_json=as_json)
    reports, unowned = [], []
    try:
        probe = queue_probe(settings)
        for i in shards:
            try:
                reports.append(Reconciler(ctx, settings, probe, shard=i).run().to_json())
            except UnownedRangesError as exc:  # its work is saved; the other shards run, then exit 1
                reports.append(exc.report.to_json())
                unowned.append(str(exc))
    except (LightmetricsError, ClientError, BotoCoreError) as exc:
        exit_for_error(exc, "cannot run the reconciler", as_json=as_json)
    report = reports[0] if len(reports) == 1 else _total(reports)
    if as_json:
        emit_json(report)
    elif len(reports) == 1:
        console.print(kv_table(f"reconcile (shard {reports[0]['shard']} of {settings.reconcile_shards})",
                               report.items()))
    else:
        console.print(grid(f"reconcile ({len(reports)} shards; slowest: shard {report['slowest_shard']})",
                           ["shard", "checkpoint", "#entries", "#verified earlier", "outcomes", "#list pages",
                            "#blob HEADs", "not closed because"],
                           [(r["shard"], f"{r['checkpoint_before']} -> {r['checkpoint_after']}", r["entries"],
                             r["verified_earlier"], r["outcomes"], r["list_pages"], r["blob_heads"],
                             r["not_closed_because"]) for r in reports]))
        console.print(kv_table("total", [(k, v) for k, v in report.items() if k != "shards"]))
    for message in unowned:
        err_console.print(f"[bold red]error:[/] {message}")
    blocked = any(r["outcomes"].get("BLOCKED") for r in reports)
    sys.exit(EXIT_VIOLATIONS if blocked or unowned else EXIT_OK)


@reconcile_cmd.command("plan")
@click.option("--ranges", type=click.IntRange(min=1), required=True,
              help="Key ranges per hour (at most LM_RECONCILE_SHARDS: one shard checks each).")
@click.option("--hour", default=None, help="YYYY-MM-DDTHH whose accepted-by-time entries are cut into equal "
                                           "counts (default: the previous hour).")
@click.option("--effective-from", default=None,
              help="YYYY-MM-DDTHH, the first hour the plan governs (at the earliest, and by default, now + 2 hours).")
@config_options
@json_option
def reconcile_plan(ranges: int, hour: str | None, effective_from: str | None, settings: Settings,
                   as_json: bool) -> None:
    """Write a write-once range plan: equal-count cuts of one hour's entries, from an hour on
    (docs/protocol.md §12 R8). Exit 2 if it has more ranges than shards, or if the plan is refused
    (too soon, out of order, or that hour already has one: the message names the earliest hour)."""
    from botocore.exceptions import BotoCoreError, ClientError

    from lightmetrics.derived.hour_ranges import MIN_LEAD_HOURS, RangePlanError, RangePlans, TooFewEntries
    from lightmetrics.protocol.errors import LightmetricsError
    from lightmetrics.protocol.keys import UtcHour

    if ranges > settings.reconcile_shards:
        fail(f"--ranges {ranges}: more ranges than reconciler shards (LM_RECONCILE_SHARDS = "
             f"{settings.reconcile_shards}) would leave ranges no shard checks; raise LM_RECONCILE_SHARDS "
             f"(and deploy its schedules) first", EXIT_USAGE, as_json=as_json)
    try:
        listed_hour = UtcHour.parse(hour) if hour else None
        asked_from = UtcHour.parse(effective_from) if effective_from else None
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE, as_json=as_json)
    ctx = configured_context(settings, as_json=as_json)
    now = ctx.clock.now_ns()
    earliest = UtcHour.of_unix_ns(now) + MIN_LEAD_HOURS
    listed_hour = listed_hour or UtcHour.of_unix_ns(now) + -1
    start = asked_from if asked_from is not None and earliest < asked_from else earliest
    plans = RangePlans(ctx.table)
    try:
        plan, names = plans.propose_from_hour(ctx.store, ctx.codec, hour=listed_hour, ranges=ranges,
                                              effective_from=start, now_ns=now)
    except TooFewEntries as exc:
        fail(f"{exc} (--hour)", EXIT_USAGE, as_json=as_json)
    except RangePlanError as exc:
        first_free = plans.earliest(now)
        fail(f"{exc}; the earliest hour a new plan can take effect is {first_free} (--effective-from {first_free})",
             EXIT_USAGE, as_json=as_json)
    except (LightmetricsError, ClientError, BotoCoreError) as exc:
        exit_for_error(exc, "cannot write the plan", as_json=as_json)
    counts = [0] * plan.ranges
    for name in names:
        counts[plan.range_of(name)] += 1
    out = {"status": "written", "effective_from": str(plan.effective_from), "hour_listed": str(listed_hour),
           "entries": len(names), "ranges": plan.ranges, "ranges_asked": ranges, "cuts": list(plan.cuts),
           "counts": counts, "shards": settings.reconcile_shards}
    if as_json:
        emit_json(out)
    else:
        console.print(kv_table("[green]range plan written[/]", [(k, v) for k, v in out.items()
                                                                 if k not in ("cuts", "counts")]))
        console.print(grid(f"ranges of {listed_hour}", ["range", "after", "up to", "#entries"],
                           [(i, *(b or "-" for b in plan.bounds(i)), counts[i])
                            for i in range(plan.ranges)]))

