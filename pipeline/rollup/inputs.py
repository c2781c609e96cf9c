"""The rollup's inputs, listed in executors (docs/pipeline.md §4 step 1): per hour, the agents
present in ``accepted-by-time/v1/<H>/`` (one listing delimited by ``.``), then contiguous ranges of
agents listed in parallel (``StartAfter``), giving the hour's input manifest-ids."""

from __future__ import annotations

from typing import Any

from lightmetrics.protocol.keys import KeyKind, UtcHour
from lightmetrics_pipeline.s3io import S3Access


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


__all__ = ["list_agents", "list_ranges"]
