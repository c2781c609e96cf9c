"""``lmctl cost``'s report: the cost model (:mod:`lightmetrics.operator_tools.cost_model`) at the
settings a rate needs, at one and three years of history, with the derived-state upkeep share and
the keep-up model's verdict on those settings (:mod:`lightmetrics.operator_tools.keepup`).

* **Settings per rate** (:data:`SCALE_SETTINGS`): what a deployment sets to follow 1,000 and
  10,000 batches/s — reconciler shards, retention's range parallelism and pending pages, the
  reap function's memory. Named, not derived: on today's design (one object per batch per index)
  no setting makes every job keep up at 1,000/s (every index write of an hour under one prefix,
  the rollup's EMR capacity), so the keep-up model cannot solve for them; it checks them,
  and the report prints its least headroom and the limit behind it.
* **History** (:data:`HISTORY_DAYS`): the audit's inventory and the stored records grow with age,
  and so does a weekly walk (it lists every record ever made; only on a bucket without S3
  Inventory: ``walks_per_month``); the report prices the same deployment at one and three years.
* **Upkeep** (``UPKEEP_PARTS``): indexing, reconciler, walk, retention and audit, one share of the
  bill (the sum of those parts' lines).

Example:
    >>> r = cost_report(100.0, 4096)
    >>> [h["years"] for h in r["histories"]]
    [1.0, 3.0]
    >>> r["histories"][1]["ratio_lightmetrics_to_alternative"] >= r["histories"][0]["ratio_lightmetrics_to_alternative"]
    True
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from lightmetrics.deployment.pricing import PRICE_TABLE, PriceTable
from lightmetrics.operator_tools.cost_model import UPKEEP_PARTS, estimate
from lightmetrics.operator_tools.cost_workload import Assumptions

#: Settings a deployment needs per rate tier (batches/s): the tier is the largest one at or below
#: the rate. 1,000: what docs/performance.md prescribed (keepup's ``docs`` profile); 10,000: the
#: most shards the settings allow (MAX_RECONCILE_SHARDS), inline Map's 40 ranges.
SCALE_SETTINGS: dict[float, dict[str, int]] = {
    0.0: {},
    1000.0: {"reconcile_shards": 96, "range_parallelism": 40, "retention_max_pending_pages": 300,
             "retention_memory_mb": 1769},
    10000.0: {"reconcile_shards": 256, "range_parallelism": 40, "retention_max_pending_pages": 300,
              "retention_memory_mb": 1769},
}
HISTORY_DAYS = (365.0, 3 * 365.0)


def settings_for_rate(rate: float) -> dict[str, int]:
    """The named settings of the largest tier at or below ``rate``.

    >>> settings_for_rate(5000.0)["reconcile_shards"]
    96
    """
    return dict(SCALE_SETTINGS[max(t for t in SCALE_SETTINGS if t <= rate)])


def _history(est: dict[str, Any], moving: set[str]) -> dict[str, Any]:
    ours, alt = est["designs"]["lightmetrics"], est["designs"]["dynamodb-dedupe"]
    parts = ours["by_part_per_million_batches_usd"]
    return {"years": est["system_age_days"] / 365.0, "system_age_days": est["system_age_days"],
            "per_million_batches_usd": ours["per_million_batches_usd"],
            "alternative_per_million_batches_usd": alt["per_million_batches_usd"],
            "ratio_lightmetrics_to_alternative": est["ratio_lightmetrics_to_alternative"],
            "derived_state_upkeep_share": ours["derived_state_upkeep_share"],
            "upkeep_per_million_batches_usd": {p: parts.get(p, 0.0) for p in UPKEEP_PARTS},
            "history_lines": {x["item"]: x["usd_per_million_batches"] for x in ours["lines"] if x["item"] in moving}}


def _moving(first: dict[str, Any], last: dict[str, Any]) -> set[str]:
    """The lines whose price differs between two histories (the ones history drives)."""
    old = {x["item"]: x["usd_per_batch"] for x in first["designs"]["lightmetrics"]["lines"]}
    return {x["item"] for x in last["designs"]["lightmetrics"]["lines"]
            if abs(x["usd_per_batch"] - old.get(x["item"], 0.0)) > 1e-9 * x["usd_per_batch"]}


def cost_report(rate: float, frame_bytes: int, *, overrides: dict[str, Any] | None = None,
                prices: PriceTable = PRICE_TABLE, histories: tuple[float, ...] = HISTORY_DAYS) -> dict[str, Any]:
    """The estimate at ``rate`` with the tier's settings (``overrides``, Assumptions by name, win),
    its figures at each history in ``histories`` and the keep-up model's verdict on the settings."""
    from lightmetrics.operator_tools.keepup import keepup

    settings = settings_for_rate(rate)
    names = {f.name for f in fields(Assumptions)}
    a = Assumptions(**{k: v for k, v in {**settings, **(overrides or {})}.items() if k in names})
    shards = int(settings.get("reconcile_shards", 1))
    est = estimate(rate, frame_bytes, assumptions=a, prices=prices, reconcile_shards=shards)
    at = {days: estimate(rate, frame_bytes, assumptions=replace(a, system_age_days=days), prices=prices,
                         reconcile_shards=shards) for days in histories}
    moving = _moving(at[histories[0]], at[histories[-1]])
    est["histories"] = [_history(at[days], moving) for days in histories]
    check = keepup(rate, overrides={**settings, **(overrides or {})})
    worst = min((j for j in check["jobs"] if j["headroom"] is not None), key=lambda j: j["headroom"])
    est["scale"] = {"settings": settings, "keepup_min_headroom": check["min_headroom"],
                    "keepup_least_job": worst["job"], "keepup_first_limit": worst["first_limit"]}
    return est
