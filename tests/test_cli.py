"""lmctl end to end: real subprocesses against the session's moto server; exit codes per the README."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

LMCTL = [shutil.which("lmctl") or os.path.join(os.path.dirname(sys.executable), "lmctl")]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(LMCTL + list(args), capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture
def env(runtime, bucket):  # type: ignore[no-untyped-def]
    e = dict(os.environ)
    e.update(LM_BUCKET=bucket, LM_COLLECTOR_ID="cli")
    return e


@pytest.fixture
def samples(tmp_path: Path) -> Path:
    path = tmp_path / "samples.jsonl"
    lines = [{"metric": "cpu", "labels": {"host": "a"}, "ts_unix_ns": 1_764_000_000_000_000_000 + i, "value": i}
             for i in range(5)]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


IDENT = ["--agent-id", "agent-cli", "--boot-id", "boot-1", "--seq-start", "100", "--seq-end", "104"]


def encode(tmp_path: Path, samples: Path, name: str = "f.lmframe", *extra: str) -> Path:
    out = tmp_path / name
    r = run("frame", "encode", *IDENT, "--samples", str(samples), "-o", str(out), "--json", *extra)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["frame_bytes"] == out.stat().st_size
    return out


def test_frame_encode_and_inspect(tmp_path, samples):  # type: ignore[no-untyped-def]
    plain = encode(tmp_path, samples)
    packed = encode(tmp_path, samples, "z.lmframe", "--zstd")
    r = run("frame", "inspect", str(packed), "--json")
    info = json.loads(r.stdout)
    assert r.returncode == 0 and info["compressed"] is True and info["sample_count"] == 5
    assert info["agent_id"] == "agent-cli" and info["seq_start"] == 100
    human = run("frame", "inspect", str(plain))
    assert human.returncode == 0 and "agent-cli" in human.stdout
    bad = tmp_path / "bad.lmframe"
    bad.write_bytes(plain.read_bytes()[:-1])
    r = run("frame", "inspect", str(bad))
    assert r.returncode == 2 and "not a valid frame" in r.stderr


def test_frame_encode_rejects_bad_input_with_exit_2(tmp_path, samples):  # type: ignore[no-untyped-def]
    r = run("frame", "encode", "--agent-id", "a/b", "--boot-id", "b", "--seq-start", "1", "--seq-end", "2",
            "--samples", str(samples), "-o", str(tmp_path / "x"))
    assert r.returncode == 2 and "must not contain '/'" in r.stderr
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"metric": "cpu", "ts_unix_ns": 1, "value": 1}\n{"metric": 3}\n')
    r = run("frame", "encode", *IDENT, "--samples", str(broken), "-o", str(tmp_path / "x"))
    assert r.returncode == 2 and "line 2" in r.stderr


def test_frame_encode_refuses_a_frame_over_the_ingest_limit(tmp_path, samples):  # type: ignore[no-untyped-def]
    # Issue 27 item 5: a frame no collector accepts (413) is not written silently. The limit is
    # LM_MAX_FRAME_BYTES, the one ingest enforces (or `lmctl --max-frame-bytes N`).
    big = tmp_path / "big.jsonl"
    big.write_text("".join(json.dumps({"metric": "cpu", "labels": {"host": f"h{i}"}, "ts_unix_ns": i, "value": i}) + "\n"
                           for i in range(100)))
    out = tmp_path / "big.lmframe"
    size = encode(tmp_path, big, "ok.lmframe").stat().st_size  # under the default limit (6 MiB): written
    env = {**os.environ, "LM_MAX_FRAME_BYTES": "1024"}
    r = run("frame", "encode", *IDENT, "--samples", str(big), "-o", str(out), env=env)
    assert r.returncode == 2 and r.stdout == "" and not out.exists()
    assert r.stderr.startswith(f"error: frame is {size} bytes, over the 1024 byte limit (LM_MAX_FRAME_BYTES): "
                               "ingest would answer 413; nothing written."), r.stderr
    assert "--allow-oversize" in r.stderr
    r = run("--max-frame-bytes", "1024", "frame", "encode", *IDENT, "--samples", str(big), "-o", str(out), "--json")
    assert r.returncode == 2 and not out.exists() and json.loads(r.stdout)["exit_code"] == 2
    # Asked to: written, with a warning on stderr; the JSON says so.
    r = run("frame", "encode", *IDENT, "--samples", str(big), "-o", str(out), "--allow-oversize", "--json", env=env)
    info = json.loads(r.stdout)
    assert r.returncode == 0 and (info["frame_bytes"], info["max_frame_bytes"], info["oversize"]) == (size, 1024, True)
    assert f"is {size} bytes, over the 1024 byte limit" in r.stderr and out.stat().st_size == size


def test_accept_duplicate_conflict_and_show(tmp_path, samples, env):  # type: ignore[no-untyped-def]
    frame = encode(tmp_path, samples)
    first = run("accept", *IDENT, "--frame", str(frame), "--json", env=env)
    assert first.returncode == 0, first.stderr
    body = json.loads(first.stdout)
    assert (body["status"], body["duplicate"]) == ("accepted", False)
    again = run("accept", *IDENT, "--frame", str(frame), "--json", env=env)
    assert again.returncode == 0 and json.loads(again.stdout)["duplicate"] is True
    other = encode(tmp_path, samples, "other.lmframe", "--zstd")  # same samples, other bytes
    conflict = run("accept", *IDENT, "--frame", str(other), "--json", env=env)
    assert conflict.returncode == 3 and json.loads(conflict.stdout)["status"] == "identity_conflict"

    shown = run("show", *IDENT, "--json", env=env)
    info = json.loads(shown.stdout)
    assert shown.returncode == 0 and info["accepted"] is True
    assert info["blob"]["present"] and info["blob"]["sha256_matches"]
    assert info["frame"]["sample_count"] == 5 and len(info["conflicts"]) == 1
    human = run("show", *IDENT, env=env)
    assert human.returncode == 0 and "manifest.frame_sha256" in human.stdout
    missing = run("show", "--agent-id", "nobody", "--boot-id", "b", "--seq-start", "1", "--seq-end", "1",
                  "--json", env=env)
    assert missing.returncode == 1 and json.loads(missing.stdout)["accepted"] is False


def test_accept_refuses_invalid_frame_and_bad_config(tmp_path, samples, env):  # type: ignore[no-untyped-def]
    junk = tmp_path / "junk"
    junk.write_bytes(b"junk")
    r = run("accept", *IDENT, "--frame", str(junk), "--json", env=env)
    assert r.returncode == 2 and json.loads(r.stdout)["status"] == "invalid"
    r = run("accept", *IDENT, "--frame", str(junk), "--bucket", "Bad_Bucket", env=env)
    assert r.returncode == 2 and "LM_BUCKET (--bucket)" in r.stderr


def test_accept_when_s3_is_down_is_exit_4(tmp_path, samples, env):  # type: ignore[no-untyped-def]
    frame = encode(tmp_path, samples)
    down = dict(env, AWS_ENDPOINT_URL="http://127.0.0.1:9", LM_S3_MAX_ATTEMPTS="1", LM_S3_TIMEOUT_S="1")
    r = run("accept", *IDENT, "--frame", str(frame), "--json", env=down)
    assert r.returncode == 4 and json.loads(r.stdout)["status"] == "unavailable"


def test_agent_token_matches_what_ingest_verifies(runtime, env):  # type: ignore[no-untyped-def]
    from lightmetrics.acceptance.auth import TokenKeys, verify_token

    keys = TokenKeys.generate("k7")
    runtime.boto3_client("secretsmanager").create_secret(Name=f"tok-{env['LM_BUCKET']}", SecretString=keys.model_dump_json())
    e = dict(env, LM_AUTH_SECRET_ID=f"tok-{env['LM_BUCKET']}")
    r = run("agent-token", "--agent-id", "agent-z", "--json", env=e)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["key_id"] == "k7"
    verify_token(keys, out["token"], "agent-z")
    assert run("agent-token", "--agent-id", "a/b", env=e).returncode == 2


def test_invoke_runs_a_handler_with_a_sample_event(env):  # type: ignore[no-untyped-def]
    r = run("invoke", "ingest", "--event", "events/ingest/missing-token.json", "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["statusCode"] == 401
    assert run("invoke", "nope", "--event", "events/ingest/missing-token.json", env=env).returncode == 2
    # The folder under functions/ names the function as well (issue 17): the S3 test event is acknowledged.
    by_name, by_folder = (run("invoke", f, "--event", "events/index_accepted/s3-test-event.json", "--json", env=env)
                          for f in ("index-accepted", "index_accepted"))
    assert by_name.returncode == by_folder.returncode == 0, by_folder.stderr
    assert json.loads(by_folder.stdout) == json.loads(by_name.stdout)


def test_json_output_is_one_strict_document(capsys):  # type: ignore[no-untyped-def]
    """Issue 17: --json output parses with a strict parser: NaN and Infinity become null."""
    from lightmetrics.cli.output import emit_json

    def refuse(name: str) -> None:
        raise AssertionError(f"non-standard JSON constant {name}")

    emit_json({"lag_s": float("inf"), "stats": {"mean": float("nan"), "min": -float("inf")}, "points": (1.5, 2)})
    assert json.loads(capsys.readouterr().out, parse_constant=refuse) == {
        "lag_s": None, "stats": {"mean": None, "min": None}, "points": [1.5, 2]}


def test_missing_region_or_credentials_exit_2_naming_the_setting():  # type: ignore[no-untyped-def]
    """Issue 17: configuration errors exit 2 and say what to set; 4 stays for "unavailable, retry"."""
    bare = {"PATH": os.environ["PATH"], "HOME": "/nonexistent", "LM_BUCKET": "bucket-x", "LM_TABLE": "table-x",
            "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
            "AWS_EC2_METADATA_DISABLED": "true"}
    r = run("status", "--json", env=bare)
    assert r.returncode == 2 and "AWS_REGION" in json.loads(r.stdout)["reason"], r.stdout + r.stderr
    r = run("status", "--json", env={**bare, "AWS_REGION": "eu-west-1"})  # AWS_REGION alone is enough for the region
    assert r.returncode == 2 and "no AWS credentials" in json.loads(r.stdout)["reason"], r.stdout + r.stderr
    r = run("conflicts", "list", env={**bare, "AWS_DEFAULT_REGION": "eu-west-1"})
    assert r.returncode == 2 and "AWS_ACCESS_KEY_ID" in r.stderr + r.stdout


def test_profile_and_region_pass_through_from_lmctl_itself():  # type: ignore[no-untyped-def]
    """Issue 17: ``--profile``/``--region`` on ``lmctl`` reach boto3; an unknown profile exits 2 naming it."""
    bare = {"PATH": os.environ["PATH"], "HOME": "/nonexistent", "LM_BUCKET": "bucket-x", "LM_TABLE": "table-x",
            "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
            "AWS_EC2_METADATA_DISABLED": "true"}
    r = run("--region", "eu-west-1", "status", "--json", env=bare)  # the region is taken: credentials are next
    assert r.returncode == 2 and "no AWS credentials" in json.loads(r.stdout)["reason"], r.stdout + r.stderr
    r = run("--region", "eu-west-1", "--profile", "no-such-profile", "status", "--json", env=bare)
    reason = json.loads(r.stdout)["reason"]
    assert r.returncode == 2 and "no-such-profile" in reason and "AWS_PROFILE" in reason, r.stdout + r.stderr


def test_invoke_with_an_invalid_setting_exits_2_naming_it():  # type: ignore[no-untyped-def]
    """Issue 17: a handler that cannot start because of the configuration is the operator's to fix:
    exit 2 naming the setting (as every other command), not 1 ("the run failed")."""
    r = run("--prefix", "bad", "invoke", "index_accepted", "--event", "events/index_accepted/object-created.json",
            "--json", env={**os.environ, "LM_BUCKET": "lm-bucket", "LM_TABLE": "lm-table"})
    out = json.loads(r.stdout)
    assert r.returncode == 2 and out["exit_code"] == 2 and "LM_PREFIX" in out["reason"], r.stdout + r.stderr


def _commands(group, path=()):  # type: ignore[no-untyped-def]
    import click

    for name, command in group.commands.items():
        yield (*path, name), command
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))


def test_settings_are_flags_of_lmctl_itself_not_repeated_on_every_subcommand():  # type: ignore[no-untyped-def]
    """Issue 17: the configuration flags are listed once, on ``lmctl``; no subcommand's help repeats them."""
    from lightmetrics.cli.main import cli
    from lightmetrics.deployment.settings import Settings

    flags = {f"--{name.replace('_', '-')}" for name in Settings.model_fields}
    assert flags <= {o for p in cli.params for o in p.opts}
    # `local up --bucket` names the bucket to provision (a different option that shares the flag).
    own_option = {("local", "up"): {"--bucket", "--table", "--prefix"}}
    repeated = {" ".join(path): sorted(shown) for path, command in _commands(cli)
                if (shown := {o for p in command.params if not getattr(p, "hidden", False) for o in p.opts}
                    & flags - own_option.get(path, set()))}
    assert not repeated, repeated


@pytest.fixture(scope="module")
def stack(runtime):  # type: ignore[no-untyped-def]
    """A stack on the local runtime whose outputs are the ones infra/stack.py declares
    (lightmetrics.operator_tools.stack_outputs), naming a provisioned local system: (stack name, settings, outputs)."""
    import uuid

    from lightmetrics.deployment.resources import SPEC
    from lightmetrics.local.system import LocalSystem
    from lightmetrics.operator_tools.stack_outputs import EMPTY_PREFIX, queue_output_key, state_machine_output_key

    tag = uuid.uuid4().hex[:10]
    system = LocalSystem(runtime, bucket=f"lm-env-{tag}", table=f"lm-env-{tag}", secret_name=f"lm-env/{tag}",
                         queue_name_prefix=f"env{tag}-").provision()
    try:
        st = system.settings
        values = {"BucketName": st.bucket, "Prefix": st.prefix or EMPTY_PREFIX, "TableName": st.table,
                  "SecretName": st.auth_secret_id, "IngestUrl": f"https://{tag}.lambda-url.us-east-1.on.aws/"}
        values.update({queue_output_key(n): st.queue_urls[n] for q in SPEC.queues for n in (q.name, q.dlq_name)})
        values[queue_output_key("reconcile-shards")] = st.reconcile_shards_queue_url
        values.update({state_machine_output_key(sm.logical_name): st.state_machine_arns[sm.name]
                       for sm in SPEC.state_machines})
        template = {"Resources": {"Anchor": {"Type": "AWS::SQS::Queue"}},
                    "Outputs": {k: {"Value": v} for k, v in values.items()}}
        runtime.boto3_client("cloudformation").create_stack(StackName=f"lm-env-{tag}", TemplateBody=json.dumps(template))
        yield f"lm-env-{tag}", st, values
    finally:
        system.stop()


def test_env_configures_lmctl_from_the_stack_outputs(runtime, stack):  # type: ignore[no-untyped-def]
    """Issue 17: eval "$(lmctl env --stack X)" points lmctl at a deployed stack."""
    from lightmetrics.deployment.resources import SPEC

    name, st, values = stack
    aws_only = {k: v for k, v in os.environ.items() if not k.startswith("LM_")}
    r = run("env", "--stack", name, "--json", env=aws_only)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert (got["LM_BUCKET"], got["LM_PREFIX"], got["LM_TABLE"]) == (st.bucket, "", st.table)
    assert json.loads(got["LM_STATE_MACHINE_ARNS"]) == {sm.name: st.state_machine_arns[sm.name]
                                                       for sm in SPEC.state_machines}
    assert json.loads(got["LM_QUEUE_URLS"]) == st.queue_urls
    assert got["LM_RECONCILE_SHARDS_QUEUE_URL"] == st.reconcile_shards_queue_url  # status reads its depth
    assert got["LM_INGEST_URL"] == values["IngestUrl"]  # what `lmctl agent run` sends to
    exports = run("env", "--stack", name, env=aws_only)
    assert exports.returncode == 0 and "export LM_PREFIX=''" in exports.stdout.splitlines()
    # The exports configure lmctl: status reads the bucket, table and queues they name.
    lmctl = " ".join(LMCTL)
    shell = subprocess.run(["bash", "-c", f'eval "$({lmctl} env --stack {name})" && {lmctl} status --json'],
                           capture_output=True, text=True, env=aws_only, timeout=120)
    out = json.loads(shell.stdout)
    assert out["queues"].keys() == st.queue_urls.keys(), shell.stderr  # every queue reached
    assert out["shard_queues"] == {"reconcile-shards": {"messages": 0, "dead_letters": 0}}, out
    # a fresh stack: its reconciler has not run yet, which status calls stuck (protocol §12 R9)
    assert shell.returncode == 1 and [c.split(":")[0] for c in out["causes"]] == ["reconciler shard 0 has never run"]
    r = run("env", "--stack", "no-such-stack", env=aws_only)
    assert r.returncode == 2 and "no stack 'no-such-stack'" in r.stderr
    cfn = runtime.boto3_client("cloudformation")
    cfn.create_stack(StackName=f"{name}-old", TemplateBody=json.dumps(
        {"Resources": {"Anchor": {"Type": "AWS::SQS::Queue"}}, "Outputs": {"BucketName": {"Value": st.bucket}}}))
    r = run("env", "--stack", f"{name}-old", env=aws_only)
    assert r.returncode == 2 and "has no output" in r.stderr and "TableName" in r.stderr


def test_env_exports_the_profile_and_region_given_to_lmctl_itself(stack, tmp_path):  # type: ignore[no-untyped-def]
    """Issue 17: `lmctl --profile P --region R env --stack S` reads with P in R and exports both,
    as `lmctl env --stack S --profile P --region R` does: the next command uses the same account."""
    name, _, _ = stack
    config = tmp_path / "config"
    config.write_text("[profile p1]\naws_access_key_id = testing\naws_secret_access_key = testing\n")
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("LM_", "AWS_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID",
                                 "AWS_SECRET_ACCESS_KEY"))}
    base.update(AWS_CONFIG_FILE=str(config), AWS_SHARED_CREDENTIALS_FILE="/nonexistent")
    for args in (["--profile", "p1", "--region", "us-east-1", "env", "--stack", name, "--json"],
                 ["env", "--stack", name, "--profile", "p1", "--region", "us-east-1", "--json"]):
        r = run(*args, env=base)
        assert r.returncode == 0, (args, r.stdout, r.stderr)
        got = json.loads(r.stdout)
        assert (got.get("AWS_PROFILE"), got["AWS_REGION"]) == ("p1", "us-east-1"), args


def test_env_with_an_unknown_profile_names_the_setting(tmp_path):  # type: ignore[no-untyped-def]
    """Issue 17: `lmctl env --stack S --profile nope` exits 2 saying what to set, like `lmctl --profile nope`."""
    bare = {"PATH": os.environ["PATH"], "HOME": "/nonexistent", "AWS_CONFIG_FILE": "/nonexistent",
            "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_EC2_METADATA_DISABLED": "true"}
    for args in (["env", "--stack", "L", "--profile", "nope", "--region", "eu-west-1"],
                 ["--profile", "nope", "env", "--stack", "L", "--region", "eu-west-1"]):
        r = run(*args, "--json", env=bare)
        reason = json.loads(r.stdout)["reason"]
        assert r.returncode == 2 and "nope" in reason and "AWS_PROFILE" in reason, (args, r.stdout, r.stderr)


def test_tables_never_cut_an_identifier_when_piped():  # type: ignore[no-untyped-def]
    """Issue 17: output that is not a terminal is full width; a long key comes out whole on one line."""
    key = "accepted-by-time/v1/date=2026-11-26/hour=13/" + "6167656e742d" * 12 + ".626f6f74.00000000000000000000.json"
    code = ("from lightmetrics.cli.output import console, grid; "
            f"console.print(grid('t', ['key', '#n'], [({key!r}, 1)]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "COLUMNS": "60"})
    assert r.returncode == 0, r.stderr
    assert any(key in line for line in r.stdout.splitlines()), r.stdout


def test_invoke_says_when_a_sample_event_opened_blockers(runtime):  # type: ignore[no-untyped-def]
    """Issue 17: a sample event run against a live runtime may leave blockers; invoke says which."""
    import uuid

    from click.testing import CliRunner

    from lightmetrics.cli.main import cli
    from lightmetrics.local.system import LocalSystem

    tag = uuid.uuid4().hex[:10]
    system = LocalSystem(runtime, bucket=f"lm-inv-{tag}", table=f"lm-inv-{tag}", secret_name=f"lm-inv/{tag}",
                         queue_name_prefix=f"inv{tag}-").provision()
    try:
        env = system.environment()
        r = CliRunner().invoke(cli, ["invoke", "index_accepted", "--event", "events/index_accepted/poisoned-body.json",
                                     "--json"], env=env)
        assert r.exit_code == 0, r.output
        json.loads(r.stdout)  # stdout stays the handler's result
        assert "this event opened 1 blocker(s)" in r.stderr and "lmctl blockers list" in r.stderr, r.stderr
        quiet = CliRunner().invoke(cli, ["invoke", "index_accepted", "--event", "events/index_accepted/s3-test-event.json",
                                         "--json"], env=env)
        assert quiet.exit_code == 0 and "blocker" not in quiet.stderr
        # the object-created sample names an acceptance record this bucket does not hold: said before the
        # run (the note comes first on stderr), and the run's blocker is reported after it
        before = CliRunner().invoke(cli, ["invoke", "index_accepted", "--event",
                                          "events/index_accepted/object-created.json", "--json"], env=env)
        assert before.exit_code == 0, before.output
        said, opened = before.stderr.find("does not hold"), before.stderr.find("this event opened")
        assert 0 <= said < opened and "accepted/v1/" in before.stderr, before.stderr
        # the sample ingest events' tokens are signed with events/ingest/secret.json's keys: a 401 says so
        refused = CliRunner().invoke(cli, ["invoke", "ingest", "--event", "events/ingest/accepted.json", "--json"],
                                     env=env)
        assert json.loads(refused.stdout)["statusCode"] == 401 and "events/ingest/secret.json" in refused.stderr
    finally:
        system.stop()


def test_invoke_json_is_the_handler_result_alone_with_real_powertools_output(env):  # type: ignore[no-untyped-def]
    """Issue 17: without the quiet Powertools settings (as an operator's shell has them), the
    handler's log lines and EMF metrics go to stderr; stdout is one JSON document."""
    from lightmetrics.local.environment import QUIET_POWERTOOLS

    loud = {k: v for k, v in env.items() if k not in QUIET_POWERTOOLS}
    loud.update(POWERTOOLS_LOG_LEVEL="INFO", POWERTOOLS_TRACE_DISABLED="true")  # no X-Ray daemon here
    for function, event in (("ingest", "events/ingest/missing-token.json"),
                            ("index_accepted", "events/index_accepted/s3-test-event.json")):
        r = run("invoke", function, "--event", event, "--json", env=loud)
        assert r.returncode == 0, r.stderr
        json.loads(r.stdout)  # nothing but the result
        assert '"level"' in r.stderr or '"_aws"' in r.stderr, r.stderr  # the handler did log: on stderr
    r = run("invoke", "ingest", "--event", "events/ingest/missing-token.json", "--json", env=loud)
    assert json.loads(r.stdout)["statusCode"] == 401 and '"_aws"' in r.stderr  # EMF metrics too


def test_human_tables_print_nested_values_as_json():  # type: ignore[no-untyped-def]
    """Issue 17: lists, dicts, booleans and None in a table are JSON, never Python's repr."""
    from rich.console import Console

    from lightmetrics.cli.output import grid, kv_table

    out = Console(width=200, record=True, file=open(os.devnull, "w"))
    out.print(kv_table("t", [("metrics", ["cpu.usage"]), ("answers", {"accepted": 1}), ("compressed", False),
                             ("span", (1, 2)), ("gone", None), ("name", "x")]))
    out.print(grid("g", ["a", "b"], [(["x"], True)]))
    text = out.export_text()
    for shown in ('["cpu.usage"]', '{"accepted": 1}', "false", "[1, 2]", "null", '["x"]', "true"):
        assert shown in text, (shown, text)
    for repr_ in ("['cpu.usage']", "{'accepted': 1}", "False", "None", "(1, 2)", "True"):
        assert repr_ not in text, (repr_, text)


def test_agent_parked_shows_the_whole_frame_hash(capsys):  # type: ignore[no-untyped-def]
    """Issue 17: no identifier is cut in a table; a parked batch's frame sha256 is printed whole."""
    from types import SimpleNamespace

    from lightmetrics.cli.agent_cmds import _print_parked

    sha = "ab" * 32
    _print_parked([SimpleNamespace(identity="a/b/1-2", kind="conflict", http_status=409, resolution=None,
                                   attempts=3, frame_sha256=sha)], [])
    assert sha in capsys.readouterr().out


def test_configuration_errors_exit_2_naming_the_setting(runtime, env):  # type: ignore[no-untyped-def]
    """Issue 17: a token secret or state machine that does not exist, or a region that is no region
    name, is a configuration error: exit 2 naming its setting, not 4 ("retry")."""
    import uuid

    from lightmetrics.local.system import LocalSystem

    r = run("--auth-secret-id", f"nope/{uuid.uuid4().hex}", "agent-token", "--agent-id", "a1", "--json", env=env)
    assert r.returncode == 2 and "LM_AUTH_SECRET_ID" in json.loads(r.stdout)["reason"], r.stdout + r.stderr
    bare = {"PATH": os.environ["PATH"], "HOME": "/nonexistent", "AWS_CONFIG_FILE": "/nonexistent",
            "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"}
    r = run("--region", "x", "--bucket", "mybucket", "status", "--json", env=bare)
    reason = json.loads(r.stdout)["reason"]
    assert r.returncode == 2 and "AWS_REGION" in reason and "'x'" in reason, r.stdout + r.stderr
    tag = uuid.uuid4().hex[:10]
    system = LocalSystem(runtime, bucket=f"lm-cfg-{tag}", table=f"lm-cfg-{tag}", secret_name=f"lm-cfg/{tag}",
                         queue_name_prefix=f"cfg{tag}-").provision()
    try:
        arns = json.dumps({"bootstrap-walk": "arn:aws:states:us-east-1:123456789012:stateMachine:Nope",
                           "reap": "arn:aws:states:us-east-1:123456789012:stateMachine:Nope2"})
        e = {**os.environ, **system.environment(), "LM_STATE_MACHINE_ARNS": arns}
        r = run("walk", "start", "--json", env=e)
        reason = json.loads(r.stdout)["reason"]
        assert r.returncode == 2 and "LM_STATE_MACHINE_ARNS" in reason, r.stdout + r.stderr
        # no ARN at all: exit 2 naming the setting and the stack output that holds the ARN
        for args, output in ((("walk", "start"), "BootstrapWalkArn"), (("reap", "gc"), "ReapArn")):
            r = run(*args, "--json", env={**e, "LM_STATE_MACHINE_ARNS": "{}"})
            reason = json.loads(r.stdout)["reason"]
            assert r.returncode == 2 and "LM_STATE_MACHINE_ARNS" in reason and output in reason, r.stdout + r.stderr
    finally:
        system.stop()


def test_usage_errors_with_json_answer_one_json_document():  # type: ignore[no-untyped-def]
    """Issue 17: a click usage error under --json is the same error document `fail` prints, exit 2;
    without --json the usage text stays on stderr."""
    for args in (["conflicts", "show", "--json"], ["frame", "inspect", "--json", "--nope", "x"],
                 ["no-such-command", "--json"]):
        r = run(*args)
        doc = json.loads(r.stdout)
        assert r.returncode == 2 and doc["status"] == "error" and doc["exit_code"] == 2 and doc["reason"], args
    r = run("conflicts", "show")
    assert r.returncode == 2 and r.stdout == "" and "Usage:" in r.stderr and "Missing argument" in r.stderr
