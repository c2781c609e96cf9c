"""The rollup's inputs, listed in executors (docs/pipeline.md §4 step 1): per hour, the agents
present in ``accepted-by-time/v1/<H>/`` (one listing delimited by ``.``), then contiguous ranges of
agents listed in parallel (``StartAfter``), giving the hour's input manifest-ids; and, where v2
objects exist, the hour's v2 entries (:func:`list_v2`, the union's other half: docs/design/
derived-state-v2.md §10 — a rollup that missed them would be wrong silently)."""

from __future__ import annotations

from typing import Any

from lightmetrics.protocol.keys import KeyKind, UtcHour
from lightmetrics.protocol.segment_keys import SegmentIndex
from lightmetrics_pipeline.s3io import S3Access, Tally


def list_agents(access: S3Access, accumulator: Any) -> Any:
    """``mapInPandas``: per hour, a listing delimited by ``.`` — one common prefix per agent
    (``<agent-hex>.``), not one key per batch — so the batches can be listed in agent ranges."""

    def run(batches: Any) -> Any:
        import numpy as np

        from lightmetrics_pipeline import s3io

        for pdf in batches:
            hours, agents = [], []
            with s3io.task_tally() as tally:
                for hour_s in pdf["hour_s"]:
                    prefix = access.codec.accepted_by_time_hour(UtcHour(int(hour_s)))
                    for common in s3io.list_all(access, prefix, delimiter=".")[1]:
                        hours.append(int(hour_s))
                        agents.append(common[len(prefix):])
            accumulator.add(tally.counts)
            yield s3io.pandas_frame({"hour_s": np.array(hours, dtype="int64"), "agent": agents})

    return run


def list_ranges(access: S3Access, accumulator: Any) -> Any:
    """``mapInPandas`` over ``(hour_s, first, last)`` agent ranges: list from just before ``first``
    (``StartAfter`` = its hex without the dot: below all its keys, above every earlier agent's)
    until the keys pass ``last``'s."""

    def run(batches: Any) -> Any:
        import numpy as np

        from lightmetrics_pipeline import s3io

        codec = access.codec
        st = s3io.store(access)
        for pdf in batches:
            hours, mids = [], []
            with s3io.task_tally() as tally:
                for hour_s, first, last in zip(pdf["hour_s"], pdf["first"], pdf["last"]):
                    prefix = codec.accepted_by_time_hour(UtcHour(int(hour_s)))
                    start_after: str | None = prefix + first[:-1]
                    token: str | None = None
                    done = False
                    while not done:
                        page = st.list_page(prefix, start_after=None if token else start_after,
                                            continuation_token=token)
                        for key in page.keys:
                            rel = key[len(prefix):]
                            if rel > last and not rel.startswith(last):
                                done = True  # the next range's agents
                                break
                            try:
                                parsed = codec.parse(key)
                            except Exception:
                                continue  # not ours: the audit reports keys outside the layout
                            if parsed.kind is KeyKind.ACCEPTED_BY_TIME and parsed.identity is not None:
                                hours.append(int(hour_s))
                                mids.append(parsed.identity.manifest_id)
                        token = page.next_token if page.truncated else None
                        done = done or token is None
            accumulator.add(tally.counts)
            yield s3io.pandas_frame({"hour_s": np.array(hours, dtype="int64"), "manifest_id": mids})

    return run


def list_v2(access: S3Access, accumulator: Any, parts: tuple[int, ...]) -> Any:
    """``mapInPandas`` over ``hour_s``: the manifest-ids of each hour's v2 ``accepted-by-time``
    entries in ``parts`` (:class:`~lightmetrics.derived.hour_entries.HourReader`: the newest seal and
    the segments it does not cover). A refused object (V-D4, V-D7, a newer schema) is one row with
    ``refused`` set to its key and reason: the driver fails that hour with it, never skips it."""

    def run(batches: Any) -> Any:
        import numpy as np

        from lightmetrics.derived.hour_entries import HourReader
        from lightmetrics.protocol.errors import SegmentError, UnsupportedVersionError
        from lightmetrics.protocol.segment_entries import entry_manifest_id
        from lightmetrics_pipeline import s3io

        reader = HourReader(s3io.store(access), access.codec, parts=parts)
        for pdf in batches:
            hours: list[int] = []
            mids: list[str] = []
            refused: list[str | None] = []
            with s3io.task_tally() as tally:
                for hour_s in pdf["hour_s"]:
                    try:
                        got = reader.read(SegmentIndex.ACCEPTED_BY_TIME, UtcHour(int(hour_s)), v1=False)
                        found = [entry_manifest_id(access.codec, e) or "" for e in got.entries]
                    except (SegmentError, UnsupportedVersionError) as exc:
                        hours.append(int(hour_s))
                        mids.append("")
                        refused.append(f"{type(exc).__name__}: {exc}")
                        continue
                    hours.extend([int(hour_s)] * len(found))
                    mids.extend(found)
                    refused.extend([None] * len(found))
            accumulator.add(tally.counts)
            yield s3io.pandas_frame({"hour_s": np.array(hours, dtype="int64"), "manifest_id": mids,
                                     "refused": refused})

    return run


def v2_parts(access: S3Access, requests: Tally) -> tuple[int, ...]:
    """The parts holding any v2 ``accepted-by-time`` object: one delimited LIST, added to
    ``requests`` (a run asks once; with none, no hour pays anything more for v2)."""
    from lightmetrics.derived.hour_entries import HourReader
    from lightmetrics_pipeline import s3io

    with s3io.task_tally() as tally:
        parts = HourReader(s3io.store(access), access.codec).v2_parts(SegmentIndex.ACCEPTED_BY_TIME)
    requests.add(tally)
    return parts


def with_v2(spark: Any, v1: Any, hours: list[UtcHour], access: S3Access, accumulator: Any, parts: tuple[int, ...],
            count: Any) -> tuple[Any, dict[int, str], Any]:
    """``(hour_s, manifest_id)`` of ``v1`` and of the hours' v2 entries, each once, without the hours
    a v2 object was refused in; ``{hour_s: reason}`` of those; the v2 frame (persisted: release it
    with the inputs). ``count`` wraps the listing function (the job's task counter)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    v2 = spark.createDataFrame([(h.start_unix_s,) for h in hours], "hour_s long").repartition(len(hours)) \
        .mapInPandas(count(list_v2(access, accumulator, parts)), "hour_s long, manifest_id string, refused string") \
        .persist(StorageLevel.MEMORY_AND_DISK)
    refused = {int(r["hour_s"]): str(r["refused"]) for r in v2.where(F.col("refused").isNotNull()).collect()}
    found = v2.where(F.col("refused").isNull()).select("hour_s", "manifest_id")
    union = v1.unionByName(found).distinct()  # a batch indexed in v1 and v2 is one input (V-D7)
    return union.where(~F.col("hour_s").isin(list(refused))), refused, v2


__all__ = ["list_agents", "list_ranges", "list_v2", "v2_parts", "with_v2"]
