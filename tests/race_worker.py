"""One OS process of the race test: submit identities 0..N-1 in its own order, record answers.

Usage: race_worker.py ENDPOINT BUCKET WORKER N GO_FILE OUT_FILE
Identities with n % 10 == 0 get content that differs per worker (conflicts); the rest are the
same bytes in every worker (duplicates).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

from conftest import ident, make_frame  # noqa: E402

from lightmetrics.acceptance.accept import accept_batch  # noqa: E402
from lightmetrics.composition.services import accept_context  # noqa: E402
from lightmetrics.deployment.settings import Settings  # noqa: E402


def main() -> None:
    endpoint, bucket, worker, n, go_file, out_file = sys.argv[1:7]
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    settings = Settings.from_env({}, bucket=bucket, collector_id=f"race-{worker}")
    ctx = accept_context(settings)
    order = list(range(int(n)))
    random.Random(int(worker)).shuffle(order)
    while not os.path.exists(go_file):  # start together
        time.sleep(0.005)
    with open(out_file, "w", encoding="utf-8") as out:
        for k in order:
            i = ident(k, agent="racer")
            variant = float(worker) if k % 10 == 0 else 0.0
            r = accept_batch(ctx, i, make_frame(i, variant=variant))
            out.write(json.dumps({"n": k, "worker": int(worker), **r.to_json()}) + "\n")


if __name__ == "__main__":
    main()
