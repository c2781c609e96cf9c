"""The EMR Serverless ``entryPoint`` (``sparkSubmit.entryPoint`` = s3://.../emr_main.py).

Shipped by ``cdk synth`` as a file asset (``infra/pipeline_bundle.py``): ``spark.submit.pyFiles``
(the code zip) provides ``lightmetrics_pipeline`` (the ``pipeline/`` folder) and ``lightmetrics``,
``spark.archives`` (the dependency zip, ``./deps`` on ``PYTHONPATH``) their third-party packages;
this file only hands the ``entryPointArguments`` to :func:`lightmetrics_pipeline.jobs.main`, e.g.
``rollup --lookback-hours 24`` (docs/pipeline.md §7).
"""

import sys

from lightmetrics_pipeline.jobs import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
