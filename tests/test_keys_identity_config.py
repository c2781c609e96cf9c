"""Key codec round trips (property tests), identity rules, typed config, tokens."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightmetrics.acceptance.auth import CachedTokenKeys, TokenKeys, bearer_token, mint_token, verify_token
from lightmetrics.deployment.settings import Settings
from lightmetrics.protocol.errors import AuthError, ConfigError, InvalidIdentityError, KeyLayoutError
from lightmetrics.protocol.identity import BatchIdentity, hex_to_id, id_to_hex
from lightmetrics.protocol.keys import LAYOUT_ROOTS, KeyCodec, KeyKind, UtcHour, encode_metric, layout_root

_id_chars = st.characters(blacklist_categories=("Cs",), blacklist_characters="/").filter(
    lambda c: not (ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F))
ids = st.text(_id_chars, min_size=1, max_size=40).filter(lambda s: len(s.encode()) <= 128)
seqs = st.integers(0, 2**64 - 1)
shas = st.binary(min_size=32, max_size=32).map(bytes.hex)
hours = st.integers(0, 4_000_000_000 // 3600).map(lambda h: UtcHour(h * 3600))
prefixes = st.sampled_from(["", "prod/", "team-a/eu/"])


@st.composite
def identities(draw):  # type: ignore[no-untyped-def]
    a, b = sorted((draw(seqs), draw(seqs)))
    return BatchIdentity.create(draw(ids), draw(ids), a, b)


@settings(max_examples=300, deadline=None)
@given(identities(), shas, hours, prefixes)
def test_every_identity_key_round_trips(identity, sha, hour, prefix):  # type: ignore[no-untyped-def]
    codec = KeyCodec(prefix)
    cases = {
        KeyKind.ACCEPTED: codec.accepted(identity),
        KeyKind.ACCEPTED_BY_TIME: codec.accepted_by_time(hour, identity),
        KeyKind.ACCEPTED_BY_BLOB: codec.accepted_by_blob(sha, identity),
        KeyKind.QUARANTINE: codec.quarantine(identity, sha),
        KeyKind.QUARANTINE_BY_BLOB: codec.quarantine_by_blob(sha, identity),
        KeyKind.CONFLICT_RESOLUTION: codec.conflict_resolution(identity, sha),
    }
    for kind, key in cases.items():
        parsed = codec.parse(key)
        assert (parsed.kind, parsed.identity) == (kind, identity)
        assert key.startswith(prefix)
        if kind is KeyKind.ACCEPTED_BY_TIME:
            assert parsed.hour == hour
        elif kind is not KeyKind.ACCEPTED:
            assert parsed.sha256 == sha


@settings(max_examples=200, deadline=None)
@given(shas, hours, st.sampled_from(["1m", "5m", "1h"]), st.text(min_size=1, max_size=30),
       st.integers(0, 10**10 - 1), st.sampled_from(["raw", "rollup"]))
def test_blob_time_rollup_and_retention_keys_round_trip(sha, hour, window, metric, gen, scope):  # type: ignore[no-untyped-def]
    codec = KeyCodec("ns/")
    assert codec.parse(codec.raw_blob(sha)).sha256 == sha
    p = codec.parse(codec.raw_blobs_by_time(hour, sha))
    assert (p.kind, p.hour, p.sha256) == (KeyKind.RAW_BLOBS_BY_TIME, hour, sha)
    p = codec.parse(codec.rollup_chunk(window, hour, metric, sha))
    assert (p.kind, p.window, p.hour, p.metric, p.chunk_id) == (KeyKind.ROLLUP_CHUNK, window, hour, metric, sha)
    assert "/" not in encode_metric(metric)
    p = codec.parse(codec.rollup_manifest(hour, gen))
    assert (p.kind, p.hour, p.generation) == (KeyKind.ROLLUP_MANIFEST, hour, gen)
    assert codec.parse(codec.rollup_index(hour, sha)).chunk_id == sha
    part = gen % 10**5
    p = codec.parse(codec.rollup_part(window, hour, gen, part, sha))
    assert (p.kind, p.window, p.hour, p.generation, p.part, p.sha256) == (KeyKind.ROLLUP_PART, window, hour, gen, part, sha)
    for build, kind in ((codec.retention_tombstone, KeyKind.RETENTION_TOMBSTONE),
                        (codec.retention_reaped, KeyKind.RETENTION_REAPED)):
        p = codec.parse(build(scope, hour))
        assert (p.kind, p.scope, p.hour) == (kind, scope, hour)
    assert codec.parse(codec.audit_run("r-1") + "summary.json").run_id == "r-1"


@settings(max_examples=100, deadline=None)
@given(identities(), shas, hours, st.sampled_from(["1m", "5m", "1h"]), st.integers(0, 10**5 - 1),
       st.sampled_from(["raw", "rollup"]), prefixes)
def test_every_key_lies_under_its_kinds_root_and_its_partition_prefixes(identity, sha, hour, window, n, scope,
                                                                         prefix):  # type: ignore[no-untyped-def]
    """The roots and prefix builders callers list with (instead of spelling the layout) are the
    prefixes of the keys the codec builds: listing them finds exactly those keys."""
    codec = KeyCodec(prefix)
    under = {  # key -> the prefixes it must lie under
        codec.raw_blob(sha): [],
        codec.raw_blobs_by_time(hour, sha): [codec.raw_blobs_by_time_hour(hour)],
        codec.accepted(identity): [codec.accepted_root()],
        codec.accepted_by_time(hour, identity): [codec.accepted_by_time_hour(hour)],
        codec.accepted_by_blob(sha, identity): [],
        codec.quarantine(identity, sha): [codec.quarantine_root()],
        codec.quarantine_by_blob(sha, identity): [],
        codec.conflict_resolution(identity, sha): [],
        codec.rollup_manifest(hour, n): [codec.rollup_manifest_hour(hour)],
        codec.rollup_chunk_list(hour, sha): [codec.rollup_manifest_hour(hour)],
        codec.rollup_chunk(window, hour, "cpu.usage", sha): [codec.rollup_window_hour(window, hour)],
        codec.rollup_part(window, hour, n, n, sha): [codec.rollup_window_hour(window, hour)],
        codec.rollup_index(hour, sha): [codec.rollup_index_hour(hour)],
        codec.retention_tombstone(scope, hour): [codec.retention_scope_root(scope)],
        codec.retention_reaped(scope, hour): [codec.retention_scope_root(scope)],
        codec.audit_committed(n, "r1"): [codec.audit_committed_root()],
    }
    for key, prefixes_of_key in under.items():
        kind = codec.parse(key).kind
        assert key.startswith(codec.root(kind)) and codec.root(kind) == prefix + layout_root(kind), key
        assert layout_root(kind) in LAYOUT_ROOTS
        for p in prefixes_of_key:
            assert key.startswith(p) and p.startswith(codec.root(kind)), (key, p)
    assert {codec.parse(k).kind for k in under} == set(KeyKind)
    other_window = {"1m": "5m", "5m": "1h", "1h": "1m"}[window]
    assert not codec.rollup_part(window, hour, n, n, sha).startswith(codec.rollup_window_hour(other_window, hour))


def test_prefix_builders_refuse_what_is_not_in_the_layout():  # type: ignore[no-untyped-def]
    codec = KeyCodec()
    with pytest.raises(KeyLayoutError):
        codec.rollup_window_hour("2m", UtcHour(0))
    with pytest.raises(KeyLayoutError):
        codec.retention_scope_root("blobs")
    assert len(LAYOUT_ROOTS) == len(set(LAYOUT_ROOTS)) == 13


def test_seq_ranges_sort_numerically_in_keys():  # type: ignore[no-untyped-def]
    codec = KeyCodec()
    keys = [codec.accepted(BatchIdentity.create("a", "b", n, n)) for n in (2, 10, 2**64 - 1, 0, 999)]
    assert [codec.parse(k).identity.seq_start for k in sorted(keys)] == [0, 2, 10, 999, 2**64 - 1]  # type: ignore[union-attr]


@pytest.mark.parametrize("args, reason", [
    (("", "b", 0, 0), "1-128 bytes"),
    (("a" * 129, "b", 0, 0), "1-128 bytes"),
    (("é" * 65, "b", 0, 0), "1-128 bytes"),
    (("a/b", "b", 0, 0), "must not contain '/'"),
    (("a\nb", "b", 0, 0), "control character"),
    (("a\x85", "b", 0, 0), "control character"),
    (("a", "b", 5, 4), "must be <="),
    (("a", "b", -1, 4), "in [0, 2^64)"),
    (("a", "b", 0, 2**64), "in [0, 2^64)"),
    (("a", "b", "1e3", 4), "decimal integer"),
    (("a", "b", True, 4), "must be an integer"),
    ((None, "b", 0, 0), "must be a string"),
])
def test_invalid_identities_are_refused_with_a_reason(args, reason):  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidIdentityError, match=re.escape(reason)):
        BatchIdentity.create(*args)


def test_id_hex_encoding_is_the_spool_encoding():  # type: ignore[no-untyped-def]
    assert id_to_hex("agent-ä") == "agent-ä".encode().hex()
    assert hex_to_id(id_to_hex("agent-ä")) == "agent-ä"
    assert BatchIdentity.create("a", "b", 1, 2).spool_name == (
        "agent=61.boot=62.00000000000000000001-00000000000000000002.lmframe")
    for bad in ("", "6", "6G", "4A", "ff"):
        with pytest.raises(InvalidIdentityError):
            hex_to_id(bad)


@pytest.mark.parametrize("key", [
    "accepted/v1/agent=61/boot=62/1-2.json",
    "accepted/v1/agent=2f/boot=62/00000000000000000001-00000000000000000002.json",  # '/' smuggled in hex
    "raw-blobs/v1/sha256/00/00/" + "ab" * 32 + ".lmbatch",  # fan-out does not match
    "accepted/v1/agent=61/boot=62/00000000000000000002-00000000000000000001.json",  # start > end
    "other/v1/x.json",
    "../accepted/v1/x",
])
def test_keys_outside_the_layout_are_refused(key):  # type: ignore[no-untyped-def]
    with pytest.raises(KeyLayoutError):
        KeyCodec().parse(key)


def test_namespace_is_enforced():  # type: ignore[no-untyped-def]
    key = KeyCodec("prod/").accepted(BatchIdentity.create("a", "b", 1, 1))
    with pytest.raises(KeyLayoutError, match="outside the prefix namespace"):
        KeyCodec("dev/").parse(key)
    with pytest.raises(KeyLayoutError):
        KeyCodec("prod")


def test_hours():  # type: ignore[no-untyped-def]
    h = UtcHour.parse("2026-11-25T13")
    assert (h.date_str, h.hour_str, str(h.next())) == ("2026-11-25", "13", "2026-11-25T14")
    assert UtcHour.of_unix_ns(h.start_ns + 3_599_999_999_999) == h
    with pytest.raises(ValueError, match="2026-11-25T13"):
        UtcHour.parse("2026-11-25 13:00")


def test_config_validates_at_start_with_variable_and_flag_names():  # type: ignore[no-untyped-def]
    s = Settings.from_env({"LM_BUCKET": "my-bucket", "LM_PREFIX": "prod/", "LM_SETTLE_S": "60"})
    assert (s.bucket, s.prefix, s.settle_s, s.ingest_acceptance) == ("my-bucket", "prod/", 60, "s3_manifest")
    assert Settings.from_env({"LM_BUCKET": "my-bucket"}, bucket="other-bucket").bucket == "other-bucket"
    with pytest.raises(ConfigError) as err:
        Settings.from_env({"LM_PREFIX": "/x", "LM_SETTLE_S": "soon", "LM_INGEST_ACCEPTANCE": "local_spool"})
    text = str(err.value)
    for needle in ("LM_BUCKET (--bucket): is required", "LM_PREFIX (--prefix)", "LM_SETTLE_S (--settle-s)",
                   "LM_INGEST_ACCEPTANCE"):
        assert needle in text


def test_tokens_rotation_and_revocation():  # type: ignore[no-untyped-def]
    old = TokenKeys(current="k1", keys={"k1": "a" * 64})
    rotated = TokenKeys(current="k2", keys={"k1": "a" * 64, "k2": "b" * 64})
    after = TokenKeys(current="k2", keys={"k2": "b" * 64})
    t_old = mint_token(old, "agent")
    verify_token(rotated, t_old, "agent")  # both keys active during the rotation
    verify_token(rotated, mint_token(rotated, "agent"), "agent")
    with pytest.raises(AuthError) as err:
        verify_token(after, t_old, "agent")
    assert err.value.status == 401
    with pytest.raises(AuthError) as err:
        verify_token(rotated, t_old, "agent-b")
    assert err.value.status == 403
    for header in (None, "", "Basic x", "Bearer "):
        with pytest.raises(AuthError):
            bearer_token(header)
    with pytest.raises(ConfigError):
        TokenKeys.parse('{"current": "k3", "keys": {"k1": "' + "a" * 64 + '"}}')


def test_token_keys_cache_bounds_staleness():  # type: ignore[no-untyped-def]
    now = [0.0]
    loads = []

    def load():  # type: ignore[no-untyped-def]
        loads.append(now[0])
        return {"current": "k1", "keys": {"k1": "c" * 64}}

    cache = CachedTokenKeys(load, max_age_s=300, now=lambda: now[0])
    cache.get(); now[0] = 299; cache.get()
    assert loads == [0.0]
    now[0] = 300; cache.get()
    assert loads == [0.0, 300]


def test_the_stacks_empty_prefix_output_is_accepted_as_no_prefix() -> None:
    """Issue 17: the stack's ``Prefix`` output is the literal ``(empty)`` when there is no prefix
    (CloudFormation refuses an empty output); ``LM_PREFIX`` takes that value as ""."""
    from lightmetrics.deployment.settings import EMPTY_PREFIX, Settings

    assert Settings.from_env({"LM_BUCKET": "lm-bucket", "LM_PREFIX": EMPTY_PREFIX}).prefix == ""
    assert Settings.from_env({"LM_BUCKET": "lm-bucket", "LM_PREFIX": "prod/"}).prefix == "prod/"
