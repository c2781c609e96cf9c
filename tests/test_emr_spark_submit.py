"""The EMR Serverless job as deployed, run locally: ``pipeline/emr_main.py`` through the pinned
PySpark's own ``bin/spark-submit`` (``local[2]``), with the bundle and the arguments of the
synthesized template — the staged asset files, the Rollup schedule's ``entryPointArguments`` and
its ``sparkSubmitParameters`` — against the embedded runtime.

What differs from EMR, and only that: ``s3://`` asset URLs become the staged files; the template's
deploy-time references (bucket, table, region) become the local system's; the EMR launcher's part
is done by hand — ``spark.emr-serverless.driverEnv.*`` become the driver's environment and the
dependency zip is unpacked as ``./deps`` in the driver's working directory (the archive alias Spark
unpacks there on a cluster driver); and local-only additions: the master, the local session's
sizing (``lightmetrics_pipeline.session.LOCAL_CONF``), quiet logs, and the moto endpoint and test credentials
(on EMR the job role's credentials come from the default chain).

Set ``LM_SPARK_SUBMIT_TRANSCRIPT=<file>`` to keep the run's command line and output.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
import zipfile
from pathlib import Path
from typing import Any

import pytest
from conftest import T0_NS
from pipeline_support import H0, accept_indexed, access_for, varied_samples
from test_infra_pipeline import _assets, _of, _template

from lightmetrics.local.environment import local_environment
from lightmetrics.local.system import LocalSystem
from lightmetrics.protocol.identity import BatchIdentity
from lightmetrics_pipeline.rollup.committed import read_committed

NEXT = H0.next()
DEPLOYED = "<deployed>"  # a reference the deployment resolves (a bucket or table name)


def _render(part: Any, assets: dict[str, Path], region: str) -> str:
    """One part of the template's ``Fn::Join``: a literal, an asset URL (-> its staged file), the
    region, or a deploy-time reference (left as :data:`DEPLOYED` for the caller to map)."""
    import re

    if isinstance(part, str):
        return part
    if "Fn::Sub" in part:
        (key,) = re.findall(r"/([0-9a-f]{64}\.\w+)$", part["Fn::Sub"])
        return str(assets[key])
    if part == {"Ref": "AWS::Region"}:
        return region
    return DEPLOYED


def _rollup_job_run(cdk_synth: Any) -> tuple[list[str], Any, Any]:
    """The Rollup state's ``entryPointArguments`` and the two substitutions it references."""
    t = _template(cdk_synth)
    (sm,) = _of(t, "AWS::StepFunctions::StateMachine").values()
    asl = json.loads(sm["Properties"]["DefinitionString"])
    submit = asl["States"]["Rollup"]["Parameters"]["JobDriver"]["SparkSubmit"]
    assert (submit["EntryPoint"], submit["SparkSubmitParameters"]) == ("${EntryPoint}", "${SparkSubmitParameters}")
    subs = sm["Properties"]["DefinitionSubstitutions"]
    return list(submit["EntryPointArguments"]), subs["EntryPoint"], subs["SparkSubmitParameters"]


def _job_python(path: str) -> str:
    """The template's interpreter if this machine has it (it does here: /usr/bin/python3.11), else
    the venv's base interpreter when it is the same Python version."""
    if Path(path).exists():
        return path
    base = getattr(sys, "_base_executable", sys.executable)
    from infra.pipeline_bundle import JOB_PYTHON

    if f"{sys.version_info.major}.{sys.version_info.minor}" != JOB_PYTHON:
        pytest.skip(f"no Python {JOB_PYTHON} here to run the job's bundle ({path} is missing)")
    return base


def test_emr_main_runs_under_spark_submit_with_the_synthesized_bundle_and_arguments(
        cdk_synth, runtime, clock, tmp_path):  # type: ignore[no-untyped-def]
    import pyspark

    from lightmetrics_pipeline.session import LOCAL_CONF, LOG4J2_FILE

    args, entry_point, parameters = _rollup_job_run(cdk_synth)
    assets = _assets(cdk_synth)
    region = os.environ["AWS_REGION"]
    entry = Path(_render(entry_point, assets, region))
    tokens = shlex.split("".join(_render(p, assets, region) for p in parameters["Fn::Join"][1]))

    # The template's literal settings decide the local system (its key prefix, above all).
    literal = dict(tokens[i + 1].split("=", 1) for i in range(0, len(tokens), 2) if tokens[i] == "--conf")
    prefix = literal["spark.executorEnv.LM_PREFIX"]
    tag = uuid.uuid4().hex[:10]
    system = LocalSystem(runtime, bucket=f"lm-emr-{tag}", table=f"lm-emr-{tag}", secret_name=f"lm-emr/{tag}",
                         prefix=prefix, queue_name_prefix=f"emr{tag}-", clock=clock).provision()
    deployed = {"LM_BUCKET": system.bucket, "LM_TABLE": system.table}
    accept_indexed(system, runtime, clock, BatchIdentity.create("agent-emr", "boot-1", 0, 99), varied_samples(7, n=12))
    system.work_context().table.put({"pk": "checkpoint#reconcile", "sk": "current", "version": 1,
                                               "hour_start_s": NEXT.start_unix_s, "hour": str(NEXT),
                                               "last_run_ns": T0_NS})  # the reconciler closed H0

    # The EMR launcher's part: driverEnv -> the driver's environment; deploy-time names -> local ones.
    local_aws = {k: v for k, v in local_environment(runtime.endpoint_url, {}).items() if not k.startswith("POWERTOOLS")}
    driver_env: dict[str, str] = {}
    submit: list[str] = []
    for i in range(0, len(tokens), 2):
        flag, value = tokens[i], tokens[i + 1]
        if flag == "--conf":
            key, v = value.split("=", 1)
            name = key.rsplit(".", 1)[-1]
            if v == DEPLOYED:
                v = deployed[name]  # KeyError: a deploy-time value this test does not know yet
            value = f"{key}={v}"
            if key.startswith("spark.emr-serverless.driverEnv."):
                driver_env[name] = v
        submit += [flag, value]
    assert DEPLOYED not in " ".join(submit)
    python = _job_python(driver_env["PYSPARK_PYTHON"])
    driver_env.update(PYSPARK_PYTHON=python, PYSPARK_DRIVER_PYTHON=python)
    submit += ["--conf", f"spark.executorEnv.PYSPARK_PYTHON={python}"]
    # Without the bundle this interpreter cannot even import the job's dependencies.
    assert subprocess.run([python, "-c", "import pydantic"], capture_output=True).returncode != 0

    workdir = tmp_path / "driver"
    archive, alias = literal["spark.archives"].rsplit("#", 1)
    with zipfile.ZipFile(archive) as zf:
        zf.extractall(workdir / alias)

    spark_home = Path(pyspark.__file__).parent
    local_only = ["--master", "local[2]", "--conf", f"spark.driver.extraJavaOptions=-Dlog4j2.configurationFile={LOG4J2_FILE}"]
    for key, value in {**LOCAL_CONF, **local_aws}.items():
        local_only += ["--conf", f"{key}={value}" if key.startswith("spark.") else f"spark.executorEnv.{key}={value}"]
    cmd = [str(spark_home / "bin" / "spark-submit"), *local_only, *submit, str(entry), *args]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYSPARK_PYTHON",
                                                              "PYSPARK_DRIVER_PYTHON")}
    env.update(local_aws, **driver_env, SPARK_HOME=str(spark_home), SPARK_LOCAL_IP="127.0.0.1")

    started = time.monotonic()
    try:
        done = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=420)
    finally:
        shutil.rmtree(workdir / alias, ignore_errors=True)  # ~300 MB unpacked; pytest keeps old temp dirs
    took = time.monotonic() - started
    transcript = os.environ.get("LM_SPARK_SUBMIT_TRANSCRIPT")
    if transcript:
        shown = {k: driver_env[k] for k in sorted(driver_env)}
        Path(transcript).write_text(
            f"# cwd: {workdir} (./{alias} = the unpacked {Path(archive).name})\n# driver environment from "
            f"spark.emr-serverless.driverEnv.*: {json.dumps(shown)}\n$ {shlex.join(cmd)}\n"
            f"# exit {done.returncode} after {took:.1f} s\n--- stdout\n{done.stdout}--- stderr\n{done.stderr}")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    by_hour = {h["hour"]: h for h in report["hours"]}
    # the 24 closed hours of the window are looked at before Spark starts; the one with batches is planned
    assert args == ["rollup", "--lookback-hours", "24"] and list(by_hour) == [str(H0)], report
    assert any(n.startswith("23 closed hours looked at") and "hold no batch" in n for n in report["notes"]), report["notes"]
    assert (by_hour[str(H0)]["status"], by_hour[str(H0)]["generation"]) == ("committed", 1)
    committed = read_committed(access_for(system, runtime), H0)
    assert committed is not None and committed["generation"] == 1  # the hour's commit point, read as readers do
