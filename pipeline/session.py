"""The one SparkSession factory of the pipeline.

Locally (tests, the CLI, the demo) the session is ``local[2]`` with few shuffle partitions and
Arrow on; the Python workers run this interpreter (``PYSPARK_PYTHON``), so they import
``lightmetrics`` and ``pipeline`` from the same environment. On EMR Serverless the master and
the Python executable come from the job's ``sparkSubmitParameters`` (docs/pipeline.md): the
factory then only adds the SQL settings (``master=None`` keeps whatever spark-submit set).

Example:
    >>> spark = get_spark()                       # doctest: +SKIP
    >>> spark.conf.get("spark.sql.execution.arrow.pyspark.enabled")   # doctest: +SKIP
    'true'
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: Settings every session gets (local and EMR).
BASE_CONF: dict[str, str] = {
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "10000",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.adaptive.enabled": "true",
}

#: Additional settings for the local session (2 cores, small data).
LOCAL_CONF: dict[str, str] = {
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "2g",
    "spark.python.worker.reuse": "true",
    "spark.sql.adaptive.coalescePartitions.enabled": "true",
}

LOCAL_MASTER = "local[2]"
#: JVM options for a short local run (the demo's minute of small jobs): the C1 compiler only (C2's
#: compiler threads cost more CPU than their code wins back in a minute: the demo's JVM used 42 s of
#: CPU with them, 20 s without) and the serial collector (no parallel GC threads on 2 cores).
SHORT_RUN_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
#: The local session's logging: errors only, on stderr.
LOG4J2_FILE = Path(__file__).with_name("log4j2.properties")


#: The Java release PySpark 4 needs (the JVM that runs Spark locally).
JAVA_MAJOR = 17


class JavaMissing(RuntimeError):
    """No usable Java for a local Spark session; the message says what to install."""


def require_java(*, environ: Mapping[str, str] | None = None) -> str:
    """The ``java`` executable a local session will start, checked before any work: PySpark
    otherwise ends minutes later in a ``JAVA_GATEWAY_EXITED`` traceback.

    >>> try:
    ...     require_java(environ={"PATH": "", "JAVA_HOME": "/nowhere"})
    ... except JavaMissing as exc:
    ...     print(exc)  # doctest: +ELLIPSIS
    Spark needs Java 17 or later and none was found (JAVA_HOME=/nowhere, not on PATH): install a JDK 17 ... or set JAVA_HOME
    """
    import re
    import shutil
    import subprocess

    env = os.environ if environ is None else environ
    home = env.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else None
    if not (java and os.access(java, os.X_OK)):
        java = shutil.which("java", path=env.get("PATH", ""))
    where = f"JAVA_HOME={home}, not on PATH" if home else "no JAVA_HOME, not on PATH"
    fix = "install a JDK 17 (e.g. apt install openjdk-17-jre-headless) or set JAVA_HOME"
    if not java:
        raise JavaMissing(f"Spark needs Java {JAVA_MAJOR} or later and none was found ({where}): {fix}")
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise JavaMissing(f"Spark needs Java {JAVA_MAJOR} or later; {java} does not run ({exc}): {fix}") from None
    found = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    major = int(found.group(1)) if found else 0
    if major == 1 and found and found.group(2):  # "1.8.0_…": Java 8
        major = int(found.group(2))
    if major < JAVA_MAJOR:
        raise JavaMissing(f"Spark needs Java {JAVA_MAJOR} or later; {java} is Java {major or 'of unknown version'}: {fix}")
    return java


def get_spark(
    app_name: str = "lightmetrics-pipeline",
    *,
    master: str | None = LOCAL_MASTER,
    conf: Mapping[str, Any] | None = None,
    java_options: str = "",
) -> Any:
    """Return the process's SparkSession, creating it on first use.

    ``master=None`` is for spark-submit (EMR Serverless): it leaves the master to the launcher.
    ``conf`` adds settings (e.g. ``spark.driver.maxResultSize``); they take effect only when this
    call creates the session — a running session is returned as it is. ``java_options``: more
    options of a local session's JVM (e.g. :data:`SHORT_RUN_JAVA_OPTIONS`).
    """
    warnings.filterwarnings("ignore", message=".*pandas.*", category=FutureWarning)
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    if master is not None:
        require_java()  # a clear message now, not a gateway traceback after minutes
        # The workers must run this interpreter: it has pyarrow, pandas and our packages.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # local[2]: no "hostname resolves to loopback" warning
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
        for key, value in LOCAL_CONF.items():
            builder = builder.config(key, value)
        # Errors only, on stderr (the JVM starts with these options: the session is created here).
        builder = builder.config("spark.driver.extraJavaOptions",
                                 f"-Dlog4j2.configurationFile={LOG4J2_FILE} {java_options}".strip())
    for key, value in {**BASE_CONF, **{k: str(v) for k, v in (conf or {}).items()}}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def stop_spark() -> None:
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()


__all__ = ["BASE_CONF", "LOCAL_CONF", "LOCAL_MASTER", "SHORT_RUN_JAVA_OPTIONS", "get_spark", "stop_spark"]
