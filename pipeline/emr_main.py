"""The EMR Serverless ``entryPoint`` (``sparkSubmit.entryPoint`` = s3://.../emr_main.py).

The job's dependency archive (venv-pack, docs/pipeline.md) provides ``pipeline`` and
``lightmetrics``; this file only hands the ``entryPointArguments`` to :func:`pipeline.jobs.main`.
"""

import sys

from pipeline.jobs import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
