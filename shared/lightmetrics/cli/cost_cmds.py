"""``lmctl cost``: dollars per million accepted batches and per month at a rate (docs/cost.md).

Example::

    lmctl cost --batches-per-second 100 --frame-bytes 4096 --retention-days 30 --system-age-days 365
    lmctl cost --batches-per-second 100 --frame-bytes 4096 --prices my-prices.json --json
    lmctl cost --batches-per-second 100 --frame-bytes 4096 --assume walks_per_month=4.35  # no S3 Inventory
    lmctl cost --batches-per-second 1000 --frame-bytes 4096 --retention-days 30   # priced at 1,000/s's settings
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import click

from lightmetrics.cli.options import json_option
from lightmetrics.cli.output import EXIT_USAGE, console, emit_json, fail, grid, kv_table


@click.command("cost")
@click.option("--batches-per-second", type=click.FloatRange(min=0, min_open=True), required=True,
              help="Accepted batches per second (sustained).")
@click.option("--frame-bytes", type=click.IntRange(min=1), required=True, help="Mean frame size in bytes.")
@click.option("--retention-days", type=click.FloatRange(min=1), default=None,
              help="Raw data retention (default: the model's assumption, LM_RETENTION_S's default).")
@click.option("--system-age-days", type=click.FloatRange(min=0), default=None,
              help="How long the system has accepted batches (the audit's inventory, a walk list all of them).")
@click.option("--prices", "prices_path", default=None, type=click.Path(dir_okay=False),
              help="JSON object overriding the dated price table (keys of lightmetrics.deployment.pricing.PRICES, 'as_of').")
@click.option("--assume", "assume", multiple=True, help="Override an assumption: NAME=VALUE (repeatable).")
@json_option
def cost_cmd(batches_per_second: float, frame_bytes: int, retention_days: float | None, system_age_days: float | None,
             prices_path: str | None, assume: tuple[str, ...], as_json: bool) -> None:
    """Estimate this system's AWS bill, every recurring component priced from measured request
    counts, next to a DynamoDB conditional put per batch plus the S3 blob (the design a team would
    otherwise build): the total, each component, the ratio, and the share of everything but
    ingest, indexing and storage; at one and three years of history, with the derived-state upkeep
    share and, at 1,000 and 10,000 batches/s, the settings that rate needs (docs/cost.md)."""
    from lightmetrics.deployment.pricing import PRICE_TABLE, PriceTable
    from lightmetrics.operator_tools.cost_report import cost_report
    from lightmetrics.operator_tools.cost_workload import Assumptions

    prices = PRICE_TABLE
    if prices_path:
        try:
            prices = PriceTable.from_mapping(json.loads(Path(prices_path).read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            fail(f"cannot use price file {prices_path}: {exc}", EXIT_USAGE, as_json=as_json)
    overrides: dict[str, object] = {}
    fields = {f.name: f for f in dataclasses.fields(Assumptions)}
    for item in assume:
        name, sep, value = item.partition("=")
        if not sep or name not in fields:
            fail(f"--assume {item!r}: expected NAME=VALUE with NAME one of {sorted(fields)}", EXIT_USAGE, as_json=as_json)
        kind = type(fields[name].default)
        try:
            overrides[name] = value.lower() in ("1", "true", "yes") if kind is bool else kind(value)
        except ValueError:
            fail(f"--assume {item!r}: {name} must be a {kind.__name__}", EXIT_USAGE, as_json=as_json)
    if retention_days is not None:
        overrides["retention_days"] = retention_days
    if system_age_days is not None:
        overrides["system_age_days"] = system_age_days
    est = cost_report(batches_per_second, frame_bytes, overrides=overrides, prices=prices)
    if as_json:
        emit_json(est)
        return
    _print_report(est)


def _print_report(est: dict[str, Any]) -> None:
    """The human report, every table within 100 columns (quantities per batch: ``--json``)."""
    a = est["assumptions"]
    assumed = (f"{est['batches_per_second']:g} batches/s, {est['frame_bytes']} B frames, {a['retention_days']:g} days "
               f"retention, {a['system_age_days']:g} days of history")
    for name, design in est["designs"].items():
        rows = [(line["item"], f"{line['usd_per_million_batches']:.2f}", f"{line['usd_per_month']:.2f}")
                for line in design["lines"]]
        rows += [(line["item"], "", f"{line['usd_per_month']:.2f}") for line in design["fixed"]]
        rows.append(("TOTAL", f"{design['per_million_batches_usd']:.2f}", f"{design['per_month_usd']:.2f}"))
        console.print(grid(f"{name}: {assumed}", ["item", "USD / 1M batches", "USD / month"], rows))
    ours = est["designs"]["lightmetrics"]
    per_million = ours["by_part_per_million_batches_usd"]
    parts = [(part, f"{usd:.2f}", f"{per_million[part]:.2f}", f"{usd / ours['per_month_usd']:.1%}")
             for part, usd in sorted(ours["by_part_per_month_usd"].items(), key=lambda kv: -kv[1])]
    parts.append(("TOTAL", f"{ours['per_month_usd']:.2f}", f"{ours['per_million_batches_usd']:.2f}", "100.0%"))
    console.print(grid("lightmetrics by part", ["part", "USD / month", "USD / 1M batches", "share"], parts))
    hist = est["histories"]
    years = [f"{h['years']:g} year{'s' if h['years'] != 1 else ''}" for h in hist]
    rows = [("lightmetrics USD / 1M batches", *(f"{h['per_million_batches_usd']:.2f}" for h in hist)),
            ("dynamodb-dedupe USD / 1M batches", *(f"{h['alternative_per_million_batches_usd']:.2f}" for h in hist)),
            ("ratio to dynamodb-dedupe", *(f"{h['ratio_lightmetrics_to_alternative']:.2f}" for h in hist)),
            ("derived-state upkeep share", *(f"{h['derived_state_upkeep_share']:.1%}" for h in hist))]
    rows += [(f"  {item}", *(f"{h['history_lines'][item]:.3f}" for h in hist)) for item in sorted(hist[0]["history_lines"])]
    console.print(grid("by history (the lines history moves, USD / 1M batches)", ["", *years], rows))
    scale = est["scale"]
    console.print(kv_table("summary", [
        ("assumptions", "--assume NAME=VALUE; --json lists them all"),
        ("lightmetrics", f"{ours['per_million_batches_usd']:.2f} USD per 1M batches"),
        ("dynamodb-dedupe", f"{est['designs']['dynamodb-dedupe']['per_million_batches_usd']:.2f} USD per 1M batches"),
        ("ratio to dynamodb-dedupe", f"{est['ratio_lightmetrics_to_alternative']:.2f}"),
        ("walk", _walk_assumed(a["walks_per_month"])),
        ("derived-state upkeep", f"{ours['derived_state_upkeep_share']:.1%} of the total"),
        ("everything but ingest, indexing and storage", f"{ours['outside_ingest_indexing_storage_share']:.1%} of the total"),
        ("SQS messages per invocation", f"{est['sqs_messages_per_invocation']:.2f} (window "
                                        f"{a['sqs_batching_window_s']:g} s, batch size {a['sqs_max_batch_size']})"),
        *((f"setting: {k}", str(v)) for k, v in scale["settings"].items()),
        ("keep-up least headroom", f"{scale['keepup_min_headroom']:.2f} ({scale['keepup_least_job']})"),
        ("keep-up first limit", scale["keepup_first_limit"]),
        ("prices", f"{est['prices']['region']} list prices as of {est['prices']['as_of']}"),
    ]))


def _walk_assumed(walks_per_month: float) -> str:
    """Which deployment the walk's lines assume (docs/cost.md, "The walk follows the deployment")."""
    if not walks_per_month:  # the audit over the inventory moves every W
        return "none: S3 Inventory (without: walks_per_month=4.35)"
    return f"{walks_per_month:g} a month over all history (no S3 Inventory)"
