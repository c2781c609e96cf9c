"""The embedded runtime as a user starts it (`lmctl local up`) and the main job (`lmctl demo`)."""

from __future__ import annotations

import http.client
import json
import os
import shlex
import signal
import socket
import subprocess
import time

from conftest import ident, make_frame
from test_cli import LMCTL


def _free_port_pair() -> int:
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
        try:
            for offset in (1, 2):  # ingest on port + 1, admin on port + 2
                with socket.socket() as b:
                    b.bind(("127.0.0.1", port + offset))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair")


def test_local_up_serves_ingest_and_stops_cleanly_on_sigterm():  # type: ignore[no-untyped-def]
    from lightmetrics.acceptance.auth import TokenKeys, mint_token

    port = _free_port_pair()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "LM_"))}
    proc = subprocess.Popen(LMCTL + ["local", "up", "--port", str(port), "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        text = ""
        deadline = time.monotonic() + 60
        while True:
            line = proc.stdout.readline()  # type: ignore[union-attr]
            assert line or proc.poll() is None, proc.stderr.read()  # type: ignore[union-attr]
            text += line
            try:
                info = json.loads(text)
                break
            except ValueError:
                assert time.monotonic() < deadline
        assert info["endpoint_url"] == f"http://127.0.0.1:{port}"
        assert info["ingest_url"] == f"http://127.0.0.1:{port + 1}"
        assert info["admin_url"] == f"http://127.0.0.1:{port + 2}"
        conn = http.client.HTTPConnection("127.0.0.1", port + 2, timeout=30)
        conn.request("GET", "/conflicts")  # unsigned: refused like an AWS_IAM Function URL
        assert conn.getresponse().status == 403
        conn.close()
        assert f"export AWS_ENDPOINT_URL=http://127.0.0.1:{port}" in info["exports"]
        assert "export LM_BUCKET=lightmetrics-local" in info["exports"]

        i = ident(1, agent="local-up-agent")
        token = mint_token(TokenKeys.parse(info["secret_value"]), i.agent_id)
        headers = {"X-Lm-Agent-Id": i.agent_id, "X-Lm-Boot-Id": i.boot_id, "X-Lm-Seq-Start": str(i.seq_start),
                   "X-Lm-Seq-End": str(i.seq_end), "Authorization": f"Bearer {token}"}
        for expected in ("accepted", "duplicate"):
            conn = http.client.HTTPConnection("127.0.0.1", port + 1, timeout=30)
            conn.request("POST", "/", body=make_frame(i), headers=headers)
            resp = conn.getresponse()
            body = json.loads(resp.read())
            conn.close()
            assert (resp.status, body["status"]) == (200, expected)

        # The event pump indexes what ingest accepted; `local drain` and `status` use the exports,
        # which `lmctl env --local PORT` prints as long as the runtime runs (issue 17).
        shell = dict(env)
        for line in info["exports"]:
            name, _, value = line.removeprefix("export ").partition("=")
            shell[name] = shlex.split(value)[0] if value else ""
        printed = subprocess.run(LMCTL + ["env", "--local", str(port)], capture_output=True, text=True, env=env,
                                 timeout=60)
        assert printed.returncode == 0 and printed.stdout.splitlines() == info["exports"], printed.stderr
        as_json = subprocess.run(LMCTL + ["env", "--local", str(port), "--json"], capture_output=True, text=True,
                                 env=env, timeout=60)
        assert json.loads(as_json.stdout) == {k: v for k, v in shell.items() if k not in env}
        drained = subprocess.run(LMCTL + ["local", "drain", "--timeout", "60", "--json"], capture_output=True,
                                 text=True, env=shell, timeout=120)
        assert drained.returncode == 0, drained.stdout + drained.stderr
        assert set(json.loads(drained.stdout)["queues"]) == {
            "index-accepted", "index-accepted-dlq", "index-raw-blobs", "index-raw-blobs-dlq",
            "index-quarantine", "index-quarantine-dlq"}
        # status is ok once the reconciler ran with the queues drained (before, it names the shard that
        # never ran or the hours left open: protocol §12 R9); its schedule here runs every minute
        ran = subprocess.run(LMCTL + ["reconcile", "--json"], capture_output=True, text=True, env=shell, timeout=120)
        assert ran.returncode == 0, ran.stdout + ran.stderr  # what the schedule runs
        shown = subprocess.run(LMCTL + ["status", "--json"], capture_output=True, text=True, env=shell, timeout=60)
        status = json.loads(shown.stdout)
        assert shown.returncode == 0 and status["ok"] is True and status["causes"] == [], status
        assert status["open_blockers"] == 0
        listing = subprocess.run(LMCTL + ["show", "--agent-id", i.agent_id, "--boot-id", i.boot_id, "--seq-start",
                                          str(i.seq_start), "--seq-end", str(i.seq_end), "--json"],
                                 capture_output=True, text=True, env=shell, timeout=60)
        assert json.loads(listing.stdout)["accepted"] is True
        import boto3

        s3 = boto3.session.Session().client("s3", endpoint_url=info["endpoint_url"], region_name="us-east-1",
                                            aws_access_key_id="testing", aws_secret_access_key="testing")
        derived = s3.list_objects_v2(Bucket="lightmetrics-local", Prefix="accepted-by-time/").get("KeyCount")
        assert derived == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    with socket.socket() as s:  # a new server can take the port again (TIME_WAIT allowed)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
    gone = subprocess.run(LMCTL + ["env", "--local", str(port)], capture_output=True, text=True, env=env, timeout=60)
    assert gone.returncode == 2 and "no local runtime" in gone.stderr  # its exports went with it


def test_local_up_output_can_be_evaled_by_a_shell():  # type: ignore[no-untyped-def]
    """Issue 27 item 2: the first stdout line was not a comment; every line is now a comment or an
    export (the handlers' logs, while the schedules run them, go to stderr), and the output points at
    `lmctl env --local PORT`."""
    port = _free_port_pair()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "LM_"))}
    proc = subprocess.Popen(LMCTL + ["local", "up", "--port", str(port), "--reconcile-every", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        lines: list[str] = []
        while not lines or not lines[-1].startswith("# Ctrl-C"):
            line = proc.stdout.readline()  # type: ignore[union-attr]
            assert line, proc.stderr.read()  # type: ignore[union-attr]
            lines.append(line.rstrip("\n"))
        assert lines[0].startswith(f"# local runtime up: AWS at http://127.0.0.1:{port}, ingest at "), lines[0]
        assert lines[1] == f'# configure a shell: eval "$(lmctl env --local {port})"  (or eval these lines)'
        assert all(x.startswith(("# ", "export ")) for x in lines), lines
        shell = subprocess.run(["bash", "-c", 'eval "$1" && echo "$LM_BUCKET $AWS_ENDPOINT_URL"', "-", "\n".join(lines)],
                               capture_output=True, text=True, timeout=30)
        assert shell.returncode == 0 and shell.stderr == "", shell.stderr
        assert shell.stdout.strip() == f"lightmetrics-local http://127.0.0.1:{port}"
        time.sleep(3)  # the reconciler and sweeper schedules run their handlers meanwhile
    finally:
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0
    assert all(x.startswith(("# ", "export ")) for x in rest.splitlines()), rest


def test_demo_quick_scale_end_to_end(tmp_path):  # type: ignore[no-untyped-def]
    """``make demo`` as a person sees it (the report on stdout, progress and the demo's own log lines
    on stderr), with the same report as JSON for the assertions (``--report-json``)."""
    from lightmetrics.harness.demo import PLANTED_FAULTS

    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "LM_"))}
    env["LM_DEMO_SCALE"] = "quick"
    usage = tmp_path / "iam-usage.tsv"  # every request moto allowed: principal, action, resource (issue 28)
    env["LM_IAM_USAGE_LOG"] = str(usage)
    report_file = tmp_path / "report.json"
    r = subprocess.run(LMCTL + ["demo", "--report-json", str(report_file)], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads(report_file.read_text())
    # issue 17: the planted faults are announced before any of their log lines; Spark stays quiet;
    # the printed report has no Python reprs, no cut values, and says what each row means
    first_fault_line = r.stderr.find("blocked:") if "blocked:" in r.stderr else len(r.stderr)
    assert PLANTED_FAULTS[:60] in r.stderr and r.stderr.find(PLANTED_FAULTS[:60]) < first_fault_line, r.stderr[:2000]
    assert not [line for line in r.stderr.splitlines() if " WARN " in line or "log4j" in line.lower()], r.stderr[-2000:]
    assert "{'" not in r.stdout and "['" not in r.stdout and "…" not in r.stdout, r.stdout
    assert "skipped by the operator" in r.stdout and "OK" in r.stdout.splitlines(), r.stdout[-500:]
    assert not any(line.startswith(("accepting", "walking", "reaping")) for line in r.stdout.splitlines()), \
        "progress belongs on stderr"
    assert "Setting default log level" not in r.stderr, r.stderr[-2000:]
    assert report["ok"] is True and report["violations"] == []
    # issue 28: each function, task and job ran as its own role, and the operator's steps as the operators'
    # (the walk's and the reaps' starts among them), never as the deployer
    rows = [line.split("\t") for line in usage.read_text().splitlines()]
    roles = {arn.split("assumed-role/")[1].split("/")[0] for arn, _, _ in rows if "assumed-role/" in arn}
    assert {f"lm-{p}" for p in ("fn-ingest", "fn-index-accepted", "fn-index-raw-blobs", "fn-index-quarantine",
                                "fn-reconcile", "fn-walk-begin", "fn-walk-plan", "fn-walk-page", "fn-walk-end",
                                "fn-reap-begin", "gc", "fn-reap-retention", "fn-reap-end", "pipeline-job",
                                "operator")} <= roles, roles
    starts = {arn.split("/")[-2] if "assumed-role/" in arn else arn for arn, action, _ in rows
              if action == "states:StartExecution" and "assumed-role/lm-fn-" not in arn}
    assert starts == {"lm-operator"}, starts  # a continue task starts the next execution as its own role
    n = 250  # the quick scale, make demo's default
    assert report["batches"] == n and report["collectors"] == 3 and report["agents"] == 10
    assert report["verified"] == report["acknowledged_identities"] == n
    # every identity accepted exactly once; resends (every 7th batch) came back as duplicates, and so
    # may a request the killed collector completed without answering (the agent's failover then reads it)
    assert report["accepted"] >= n - 10
    assert report["accepted"] <= n and report["duplicates"] >= n // 7 - 5
    assert report["killed_collector"]["killed"] is True and report["failovers"] >= 1
    assert report["conflict"]["ok"] is True and report["identity_conflicts"] == 1
    assert report["unavailable_503"] == 0
    assert 2.0 <= report["s3_requests_per_accepted_batch"] < 3.0
    # issue 6: orphans collected and an expired hour reaped through the reap state machine
    reaps = report["reaps"]
    assert reaps["ok"] is True and reaps["orphans"] >= 1 and reaps["orphans_purged"] is True
    assert reaps["retention"]["hours_reaped"] == [reaps["expired_hour"]] and reaps["verify_ok"] is True
    # the pipeline phase took the Spark session the demo started beside the earlier phases
    assert report["pipeline"]["ok"] is True and report["pipeline"]["spark_started_early"] is True
    assert "-XX:TieredStopAtLevel=1" in report["pipeline"]["spark_java_options"]  # a JVM tuned for a short run
