"""A DynamoDB lease for a pipeline job (``lease#<name>`` / ``lease`` in the control table).

The lease avoids wasted work; it is not what makes a rollup correct (S3 cannot check a fencing
token). Correctness comes from conditional creates on keys that carry the generation number: of
two owners that both get past an expired lease, exactly one creates ``generation=N`` and the
other is refused (:class:`pipeline.rollup.GenerationTaken`).

Taking the lease is a conditional write (absent, or expired); each take increments the epoch;
renewals and the release are conditional on ``(owner, epoch)``, so a run that lost its lease
learns it (:class:`LeaseLost`) before it commits anything else. Liveness is the ``expires_at_ns``
attribute, never the item's presence (docs/control-table.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lightmetrics.clock import Clock
from lightmetrics.control_table import ConditionFailed, ControlTable

_NS = 1_000_000_000


class LeaseHeld(Exception):
    """Another owner holds the lease (the CLI exits 5)."""


class LeaseLost(Exception):
    """This owner no longer holds the lease (expired and taken by another run)."""


@dataclass
class Lease:
    table: ControlTable
    name: str
    owner: str
    clock: Clock
    duration_s: int = 900
    epoch: int = 0

    @property
    def pk(self) -> str:
        return f"lease#{self.name}"

    def current(self) -> dict[str, Any] | None:
        return self.table.get(self.pk, "lease")

    def acquire(self) -> "Lease":
        now = self.clock.now_ns()
        item = self.current()
        if item and int(item.get("expires_at_ns", 0)) > now and item.get("owner") != self.owner:
            left = (int(item["expires_at_ns"]) - now) / _NS
            raise LeaseHeld(f"the {self.name} lease is held by {item.get('owner')} (epoch {item.get('epoch')}) "
                            f"for another {left:.0f} s")
        epoch = int((item or {}).get("epoch", 0)) + 1
        values = {"pk": self.pk, "sk": "lease", "owner": self.owner, "epoch": epoch,
                  "expires_at_ns": now + self.duration_s * _NS, "taken_at_ns": now}
        try:
            if item is None:
                self.table.put(values, condition="attribute_not_exists(pk)")
            else:
                self.table.put(values, condition="#e = :e AND (#x <= :now OR #o = :me)",
                               names={"#e": "epoch", "#x": "expires_at_ns", "#o": "owner"},
                               values_for_condition={":e": int(item.get("epoch", 0)), ":now": now, ":me": self.owner})
        except ConditionFailed:
            raise LeaseHeld(f"the {self.name} lease was taken by another run just now") from None
        self.epoch = epoch
        return self

    def renew(self) -> None:
        now = self.clock.now_ns()
        try:
            self.table.update(self.pk, "lease", "SET #x = :x", names={"#x": "expires_at_ns", "#o": "owner", "#e": "epoch"},
                              values={":x": now + self.duration_s * _NS, ":me": self.owner, ":e": self.epoch},
                              condition="#o = :me AND #e = :e")
        except ConditionFailed:
            raise LeaseLost(f"owner {self.owner} lost the {self.name} lease (epoch {self.epoch})") from None

    def release(self) -> None:
        try:
            self.table.update(self.pk, "lease", "SET #x = :zero", names={"#x": "expires_at_ns", "#o": "owner", "#e": "epoch"},
                              values={":zero": 0, ":me": self.owner, ":e": self.epoch}, condition="#o = :me AND #e = :e")
        except ConditionFailed:
            pass  # somebody took it over after it expired: nothing of ours to release


__all__ = ["Lease", "LeaseHeld", "LeaseLost"]
