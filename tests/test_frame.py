"""Tests of Lightmetrics frame v1 (shared/lightmetrics/protocol/frame.py, docs/frame-format.md)."""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from lightmetrics.protocol import frame as frame_mod
from lightmetrics.protocol.errors import FrameError
from lightmetrics.protocol.frame import (
    FLAG_ZSTD,
    MAGIC,
    MAX_DECODED_PAYLOAD_BYTES,
    MAX_LABEL_KEY_BYTES,
    MAX_LABEL_VALUE_BYTES,
    MAX_LABELS,
    MAX_METRIC_BYTES,
    MAX_SAMPLES,
    MIN_FRAME_BYTES,
    Frame,
    Sample,
    decode_frame,
    encode_frame,
    load_samples_jsonl,
    summarize_frame,
    validate_frame,
)
from lightmetrics.protocol.identity import MAX_ID_BYTES, BatchIdentity

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = json.loads((ROOT / "tests" / "golden" / "frame_v1.json").read_text(encoding="utf-8"))["vectors"]
DOC = (ROOT / "docs" / "frame-format.md").read_text(encoding="utf-8")

IDENT = BatchIdentity.create("agent-a", "boot-1", 1, 2)
NAN_BITS = b"\x7f\xf8\x00\x00\x00\x00\x00\x00"


# --------------------------------------------------------------------------- raw builders
# An independent writer of the wire format, so hostile frames can be built field by field.


def u8(n: int) -> bytes:
    return struct.pack(">B", n)


def u16(n: int) -> bytes:
    return struct.pack(">H", n)


def u32(n: int) -> bytes:
    return struct.pack(">I", n)


def u64(n: int) -> bytes:
    return struct.pack(">Q", n)


def f64(x: float) -> bytes:
    return NAN_BITS if math.isnan(x) else struct.pack(">d", x)


def raw_sample(metric: bytes, labels: Sequence[tuple[bytes, bytes]] = (), ts: int = 0, value: bytes = f64(1.0)) -> bytes:
    out = u16(len(metric)) + metric + u16(len(labels))
    for key, val in labels:
        out += u16(len(key)) + key + u16(len(val)) + val
    return out + struct.pack(">q", ts) + value


def raw_block(samples: list[Sample]) -> bytes:
    return b"".join(
        raw_sample(
            s.metric.encode(),
            [(k.encode(), v.encode()) for k, v in sorted(s.labels, key=lambda kv: kv[0].encode())],
            s.ts_unix_ns,
            f64(s.value),
        )
        for s in samples
    )


def zstd(block: bytes, **kwargs: object) -> bytes:
    params = {"level": 3, "write_content_size": True, "write_checksum": False, "write_dict_id": False}
    params.update(kwargs)
    return zstandard.ZstdCompressor(**params).compress(block)  # type: ignore[arg-type]


def with_crc(body: bytes) -> bytes:
    return body + u32(zlib.crc32(body))


def raw_frame(
    block: bytes,
    count: int,
    *,
    agent: bytes = b"agent-a",
    boot: bytes = b"boot-1",
    seq: tuple[int, int] = (1, 2),
    flags: int = 0,
    wire: int = 1,
    version: int = 1,
    magic: bytes = MAGIC,
    agent_len: int | None = None,
    boot_len: int | None = None,
    compress: bool = False,
    payload: bytes | None = None,
    payload_len: int | None = None,
    extra: bytes = b"",
) -> bytes:
    if payload is None:
        payload = zstd(block) if compress else block
    if compress:
        flags |= FLAG_ZSTD
    body = (
        magic
        + bytes([wire, version])
        + u16(flags)
        + u8(len(agent) if agent_len is None else agent_len)
        + agent
        + u8(len(boot) if boot_len is None else boot_len)
        + boot
        + u64(seq[0])
        + u64(seq[1])
        + u32(count)
        + u32(len(payload) if payload_len is None else payload_len)
        + payload
        + extra
    )
    return with_crc(body)


# --------------------------------------------------------------------------- random valid data

METRICS = ["up", "cpu_seconds_total", "http_requests_total", "température", "日本語", "m" * MAX_METRIC_BYTES]
KEYS = ["host", "mode", "code", "method", "région", "a", "b", "Z", "_", "k" * MAX_LABEL_KEY_BYTES]
VALUES = ["", "web-1", "GET", "200", "Zürich", "/var", "v" * MAX_LABEL_VALUE_BYTES, "😀"]
FLOATS = [0.0, -0.0, 1.0, -1.5, 1e308, 5e-324, math.inf, -math.inf, math.nan, 12.5]


def rand_sample(rng: random.Random) -> Sample:
    labels = {k: rng.choice(VALUES) for k in rng.sample(KEYS, rng.randint(0, 4))}
    value = rng.choice(FLOATS) if rng.random() < 0.3 else rng.uniform(-1e6, 1e6)
    ts = rng.choice([0, -1, 2**63 - 1, -(2**63), rng.randint(-(2**63), 2**63 - 1)])
    return Sample(rng.choice(METRICS), labels, ts, value)


def rand_samples(rng: random.Random, max_n: int = 4) -> list[Sample]:
    return [rand_sample(rng) for _ in range(rng.randint(1, max_n))]


def rand_frame(rng: random.Random) -> bytes:
    ident = BatchIdentity.create(
        rng.choice(["agent-a", "a", "ägent", "x" * MAX_ID_BYTES]), rng.choice(["boot-1", "b"]), 5, 9
    )
    return encode_frame(ident, rand_samples(rng), compress=rng.random() < 0.5)


def golden_inputs(vector: dict) -> tuple[BatchIdentity, list[Sample]]:
    return BatchIdentity.create(**vector["identity"]), [Sample.from_json(s) for s in vector["samples"]]


# --------------------------------------------------------------------------- golden vectors


@pytest.mark.parametrize("vector", GOLDEN, ids=[v["name"] for v in GOLDEN])
def test_golden_vector_bytes(vector: dict) -> None:
    identity, samples = golden_inputs(vector)
    data = encode_frame(identity, samples, compress=vector["compress"])
    assert data.hex() == vector["frame_hex"]
    assert len(data) == vector["frame_bytes"]
    assert hashlib.sha256(data).hexdigest() == vector["frame_sha256"]
    decoded = decode_frame(data)
    assert decoded == Frame(identity, FLAG_ZSTD if vector["compress"] else 0, tuple(samples))
    assert encode_frame(decoded.identity, decoded.samples, compress=decoded.compressed) == data


@pytest.mark.parametrize("vector", GOLDEN, ids=[v["name"] for v in GOLDEN])
def test_doc_quotes_golden_vectors(vector: dict) -> None:
    compact_doc = re.sub(r"\s+", "", DOC)
    assert vector["frame_hex"] in compact_doc, f"{vector['name']} hex missing from docs/frame-format.md"
    assert vector["frame_sha256"] in DOC
    assert f"{vector['frame_bytes']} bytes, SHA-256 `{vector['frame_sha256']}`" in DOC


def test_doc_claims_about_vectors() -> None:
    compressed = next(v for v in GOLDEN if v["compress"])
    identity, samples = golden_inputs(compressed)
    block = raw_block(samples)
    data = bytes.fromhex(compressed["frame_hex"])
    assert f"The samples block is {len(block)} bytes" in DOC
    assert f"payload is {len(data) - 38 - 7 - 6} bytes of zstd" in DOC
    assert f"libzstd {'.'.join(map(str, zstandard.ZSTD_VERSION))}" in DOC
    tiny = bytes.fromhex(GOLDEN[0]["frame_hex"])
    assert f"CRC-32 of the {len(tiny) - 4} bytes above" in DOC


def test_raw_builder_matches_encoder() -> None:
    rng = random.Random(7)
    for _ in range(200):
        samples = rand_samples(rng)
        compress = rng.random() < 0.5
        expected = raw_frame(raw_block(samples), len(samples), compress=compress)
        assert encode_frame(IDENT, samples, compress=compress) == expected


# --------------------------------------------------------------------------- round trip / canonical

_text_chars = st.characters(blacklist_categories=("Cs", "Cc"))
ids = st.text(st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="/"), min_size=1, max_size=32)
seqs = st.integers(0, 2**64 - 1)
identities = st.tuples(ids, ids, seqs, seqs).map(
    lambda t: BatchIdentity.create(t[0], t[1], min(t[2], t[3]), max(t[2], t[3]))
)
samples_st = st.builds(
    Sample,
    metric=st.text(_text_chars, min_size=1, max_size=64),
    labels=st.dictionaries(
        st.text(_text_chars, min_size=1, max_size=64), st.text(_text_chars, max_size=256), max_size=6
    ),
    ts_unix_ns=st.integers(-(2**63), 2**63 - 1),
    value=st.floats(allow_nan=True, allow_infinity=True),
)


@settings(max_examples=150, deadline=None)
@given(identity=identities, samples=st.lists(samples_st, min_size=1, max_size=5), compress=st.booleans())
def test_round_trip(identity: BatchIdentity, samples: list[Sample], compress: bool) -> None:
    data = encode_frame(identity, samples, compress=compress)
    frame = decode_frame(data)
    assert frame == Frame(identity, FLAG_ZSTD if compress else 0, tuple(samples))
    assert frame.compressed is compress
    assert validate_frame(data, identity) == frame
    # Canonical: encoding is a fixed point and deterministic across calls.
    assert encode_frame(frame.identity, frame.samples, compress=compress) == data
    assert encode_frame(identity, samples, compress=compress) == data


@settings(max_examples=60, deadline=None)
@given(samples=st.lists(samples_st, min_size=1, max_size=4), seed=st.integers(0, 2**32))
def test_label_order_does_not_change_bytes(samples: list[Sample], seed: int) -> None:
    rng = random.Random(seed)
    shuffled = []
    for s in samples:
        pairs = list(s.labels)
        rng.shuffle(pairs)
        shuffled.append(Sample(s.metric, dict(pairs), s.ts_unix_ns, s.value))
    for compress in (False, True):
        assert encode_frame(IDENT, shuffled, compress=compress) == encode_frame(IDENT, samples, compress=compress)


def test_labels_sorted_by_utf8_bytes() -> None:
    sample = Sample("m", {"é": "1", "z": "2", "Z": "3", "a": "4"}, 0, 0.0)
    assert [k for k, _ in sample.labels] == ["Z", "a", "z", "é"]
    assert sample.label_map == {"é": "1", "z": "2", "Z": "3", "a": "4"}
    assert Sample("m", [("b", "1"), ("a", "2")]) == Sample("m", {"a": "2", "b": "1"})


def test_nan_is_canonical_and_zero_sign_kept() -> None:
    other_nans = [struct.unpack(">d", bytes.fromhex(h))[0] for h in ("fff8000000000000", "7ff0000000000001", "7fffffffffffffff")]
    frames = {encode_frame(IDENT, [Sample("m", {}, 0, nan)]) for nan in other_nans + [math.nan]}
    assert len(frames) == 1
    (data,) = frames
    assert NAN_BITS in data
    assert Sample("m", {}, 0, other_nans[0]) == Sample("m", {}, 0, math.nan)
    assert Sample("m", {}, 0, 0.0) != Sample("m", {}, 0, -0.0)
    assert encode_frame(IDENT, [Sample("m", {}, 0, 0.0)]) != encode_frame(IDENT, [Sample("m", {}, 0, -0.0)])
    assert math.copysign(1.0, decode_frame(encode_frame(IDENT, [Sample("m", {}, 0, -0.0)])).samples[0].value) == -1.0


def test_decoder_accepts_non_canonical_nan_and_reencodes_canonically() -> None:
    odd_nan = bytes.fromhex("fff0000000000007")
    data = raw_frame(raw_sample(b"m", value=odd_nan), 1)
    frame = decode_frame(data)
    assert math.isnan(frame.samples[0].value)
    reencoded = encode_frame(frame.identity, frame.samples)
    assert reencoded != data and reencoded == raw_frame(raw_sample(b"m", value=NAN_BITS), 1)


def test_boundary_sizes_accepted() -> None:
    labels = {f"{i:03d}" + "k" * (MAX_LABEL_KEY_BYTES - 3): "v" * MAX_LABEL_VALUE_BYTES for i in range(MAX_LABELS)}
    ident = BatchIdentity.create("é" * (MAX_ID_BYTES // 2), "b" * MAX_ID_BYTES, 2**64 - 1, 2**64 - 1)
    samples = [Sample("m" * MAX_METRIC_BYTES, labels, -(2**63), math.inf), Sample("x", {"k": ""}, 2**63 - 1, 5e-324)]
    for compress in (False, True):
        data = encode_frame(ident, samples, compress=compress)
        assert decode_frame(data).samples == tuple(samples)


def test_frame_accepts_bytes_like() -> None:
    data = encode_frame(IDENT, [Sample("up")])
    assert decode_frame(bytearray(data)) == decode_frame(memoryview(data)) == decode_frame(data)
    with pytest.raises(FrameError, match="must be bytes"):
        decode_frame(data.hex())  # type: ignore[arg-type]


# --------------------------------------------------------------------------- encoder errors


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda: encode_frame(IDENT, []), "at least 1 sample"),
        (lambda: encode_frame(IDENT, [{"metric": "up"}]), "not a Sample"),  # type: ignore[list-item]
        (lambda: encode_frame(BatchIdentity("a/b", "boot", 1, 1), [Sample("up")]), "must not contain '/'"),
        (lambda: encode_frame(BatchIdentity("a", "boot", 3, 1), [Sample("up")]), "must be <="),
        (lambda: encode_frame(("a", "b", 1, 1), [Sample("up")]), "must be a BatchIdentity"),  # type: ignore[arg-type]
        (lambda: Sample(""), "metric name must be 1-256 bytes"),
        (lambda: Sample("m" * 257), "metric name must be 1-256 bytes"),
        (lambda: Sample("é" * 129), "got 258"),
        (lambda: Sample("a\nb"), "control character (U+000A)"),
        (lambda: Sample("a\x85b"), "control character (U+0085)"),
        (lambda: Sample("a\ud800"), "not valid UTF-8"),
        (lambda: Sample(b"up"), "metric name must be a string"),  # type: ignore[arg-type]
        (lambda: Sample("m", {"": "v"}), "label key must be 1-256"),
        (lambda: Sample("m", {"k" * 257: "v"}), "label key must be 1-256"),
        (lambda: Sample("m", {"k": "v" * 1025}), "value must be 0-1024"),
        (lambda: Sample("m", {"k": "\x7f"}), "control character (U+007F)"),
        (lambda: Sample("m", {"k": 1}), "value must be a string"),  # type: ignore[dict-item]
        (lambda: Sample("m", {str(i): "" for i in range(65)}), "at most 64 labels"),
        (lambda: Sample("m", [("a", "1"), ("a", "2")]), "duplicate label key 'a'"),
        (lambda: Sample("m", "a=b"), "labels must be a mapping"),  # type: ignore[arg-type]
        (lambda: Sample("m", [("a", "1", "x")]), "labels must be a mapping"),  # type: ignore[list-item]
        (lambda: Sample("m", {}, 2**63), "signed 64-bit"),
        (lambda: Sample("m", {}, -(2**63) - 1), "signed 64-bit"),
        (lambda: Sample("m", {}, True), "ts_unix_ns must be an integer"),
        (lambda: Sample("m", {}, 1.0), "ts_unix_ns must be an integer"),  # type: ignore[arg-type]
        (lambda: Sample("m", {}, 0, "1"), "value must be a number"),  # type: ignore[arg-type]
        (lambda: Sample("m", {}, 0, False), "value must be a number"),
        (lambda: Sample("m", {}, 0, 10**400), "too large"),
    ],
)
def test_invalid_samples_and_identities_rejected(make: Callable[[], object], reason: str) -> None:
    with pytest.raises(FrameError) as info:
        make()
    assert reason in str(info.value)


def test_encoder_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(frame_mod, "MAX_SAMPLES", 3)
    with pytest.raises(FrameError, match="at most 3 samples"):
        encode_frame(IDENT, [Sample("up")] * 4)
    monkeypatch.setattr(frame_mod, "MAX_DECODED_PAYLOAD_BYTES", 40)
    with pytest.raises(FrameError, match="over the 40 byte limit"):
        encode_frame(IDENT, [Sample("up")] * 3, compress=True)


# --------------------------------------------------------------------------- decoder: specific reasons


def _reason(data: bytes, **kwargs: object) -> str:
    with pytest.raises(FrameError) as info:
        decode_frame(data, **kwargs)  # type: ignore[arg-type]
    return str(info.value)


def test_decoder_reasons() -> None:
    block = raw_sample(b"up")
    good = raw_frame(block, 1)
    assert decode_frame(good).samples == (Sample("up", {}, 0, 1.0),)
    assert _reason(b"") == "truncated in magic"
    assert _reason(b"LM") == "truncated in magic"
    assert _reason(b"LMF2" + good[4:]) == "bad magic"
    assert _reason(good[:5]).startswith("truncated in header")
    assert _reason(raw_frame(block, 1, wire=2)) == "unsupported wire version 2"
    assert _reason(raw_frame(block, 1, version=2)) == "unsupported frame version 2"
    assert _reason(good[:-1]) == "checksum mismatch"
    assert _reason(good + b"\x00") == "checksum mismatch"
    assert _reason(bytes([good[0]]) + good[1:20] + bytes([good[20] ^ 1]) + good[21:]) == "checksum mismatch"
    assert _reason(with_crc(good[:-4] + b"\x00")) == "1 unexpected bytes between payload and checksum"
    assert _reason(raw_frame(block, 1, flags=0x0004)) == "unknown flags 0x0004"
    assert _reason(raw_frame(block, 1, flags=0x8002)) == "unknown flags 0x8002"
    assert "agent_id length 0" in _reason(raw_frame(block, 1, agent=b""))
    assert "boot_id length 200" in _reason(raw_frame(block, 1, boot=b"b" * 200))
    assert "agent_id must not contain '/'" in _reason(raw_frame(block, 1, agent=b"a/b"))
    assert "boot_id is not valid UTF-8" in _reason(raw_frame(block, 1, boot=b"\xff"))
    assert "control character (U+0000)" in _reason(raw_frame(block, 1, agent=b"a\x00"))
    assert "seq_start (5) must be <= seq_end (4)" in _reason(raw_frame(block, 1, seq=(5, 4)))
    assert _reason(raw_frame(b"", 0)) == f"sample_count 0 is outside 1-{MAX_SAMPLES}"
    assert _reason(raw_frame(block, MAX_SAMPLES + 1)) == f"sample_count {MAX_SAMPLES + 1} is outside 1-{MAX_SAMPLES}"
    assert _reason(raw_frame(block, 2)) == "truncated in samples block (sample 1)"
    assert _reason(raw_frame(block + block, 1)).startswith("22 bytes left over in samples block")
    assert _reason(raw_frame(block, 1, payload_len=2**32 - 1)).startswith("truncated in payload (payload_length 4294967295")
    assert "unexpected bytes" in _reason(raw_frame(block, 1, payload_len=len(block) - 1))
    labels_unsorted = raw_sample(b"m", [(b"b", b""), (b"a", b"")])
    assert _reason(raw_frame(labels_unsorted, 1)) == "unsorted label key 'a' (sample 0)"
    labels_dup = raw_sample(b"m", [(b"a", b"1"), (b"a", b"2")])
    assert _reason(raw_frame(labels_dup, 1)) == "duplicate label key 'a' (sample 0)"
    assert "metric name is not valid UTF-8" in _reason(raw_frame(raw_sample(b"\xc0\xaf"), 1))
    assert "metric name contains a control character (U+009F)" in _reason(raw_frame(raw_sample(b"\xc2\x9f"), 1))
    assert "label value length 1025" in _reason(raw_frame(raw_sample(b"m", [(b"k", b"v" * 1025)]), 1))


def test_decoder_zstd_reasons() -> None:
    block = raw_sample(b"up")
    assert _reason(raw_frame(block, 1, flags=FLAG_ZSTD)) == "compressed payload is not a zstd frame"
    no_size = zstd(block, write_content_size=False)
    assert _reason(raw_frame(block, 1, compress=True, payload=no_size)) == "compressed payload does not declare its content size"
    huge = b"\x28\xb5\x2f\xfd\xc0\x50" + (2**40).to_bytes(8, "little") + b"\x00" * 8
    assert f"declares 1099511627776 bytes, over the {MAX_DECODED_PAYLOAD_BYTES} byte limit" in _reason(raw_frame(block, 1, compress=True, payload=huge))
    assert _reason(raw_frame(block, 1, compress=True, payload=zstd(block) + b"x")) == "1 bytes after the zstd frame in the payload"
    assert "after the zstd frame" in _reason(raw_frame(block, 1, compress=True, payload=zstd(block) * 2))
    assert _reason(raw_frame(block, 1, compress=True, payload=zstd(block)[:-2])) in (
        "compressed payload is truncated",
        "compressed payload is corrupt",
    )
    checked = bytearray(zstd(block, write_checksum=True))
    checked[-1] ^= 0xFF
    assert _reason(raw_frame(block, 1, compress=True, payload=bytes(checked))) == "compressed payload is corrupt"
    # A zstd frame holding a hostile block: the samples rules apply after decompression.
    assert _reason(raw_frame(block + b"\x00", 1, compress=True)).startswith("1 bytes left over")


def test_uncompressed_payload_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    block = raw_sample(b"up") * 3
    monkeypatch.setattr(frame_mod, "MAX_DECODED_PAYLOAD_BYTES", len(block) - 1)
    assert _reason(raw_frame(block, 3)) == f"payload is {len(block)} bytes, over the {len(block) - 1} byte limit"
    assert "over the" in _reason(raw_frame(block, 3, compress=True))


def test_max_frame_bytes() -> None:
    data = encode_frame(IDENT, [Sample("up")])
    assert decode_frame(data, max_frame_bytes=len(data)).identity == IDENT
    assert _reason(data, max_frame_bytes=len(data) - 1) == f"frame is {len(data)} bytes, over the {len(data) - 1} byte limit"
    # The size limit is checked first, before the magic or anything else.
    assert _reason(b"x" * 7340033, max_frame_bytes=6291456) == "frame is 7340033 bytes, over the 6291456 byte limit"
    with pytest.raises(FrameError, match="over the 10 byte limit"):
        validate_frame(data, IDENT, max_frame_bytes=10)


def test_validate_frame_identity() -> None:
    ident = BatchIdentity.create("agent-a", "boot-1", 1, 2)
    data = encode_frame(ident, [Sample("up")])
    assert validate_frame(data, ident).identity == ident
    assert validate_frame(data).identity == ident
    with pytest.raises(FrameError) as info:
        validate_frame(data, BatchIdentity.create("agent-a", "boot-1", 1, 3))
    assert str(info.value) == "frame identity agent-a/boot-1/1-2 does not match request identity agent-a/boot-1/1-3"
    for other in (("agent-b", "boot-1", 1, 2), ("agent-a", "boot-2", 1, 2), ("agent-a", "boot-1", 0, 2)):
        with pytest.raises(FrameError, match="does not match request identity"):
            validate_frame(data, BatchIdentity.create(*other))


# --------------------------------------------------------------------------- malformed inputs

INVALID_UTF8 = [b"\xff", b"\xfe", b"\x80", b"\xc0\xaf", b"\xe0\x80\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc3", b"\xe2\x82", b"\xf0\x9f\x98"]
CONTROL = [chr(c).encode() for c in [*range(0x20), *range(0x7F, 0xA0)]]

Case = tuple[bytes, str | None]  # (frame, required substring of the reason or None)


def _poison(rng: random.Random, bad: bytes) -> bytes:
    """ASCII text with ``bad`` spliced in somewhere."""
    text = bytes(rng.choice(b"abcxyz_.-") for _ in range(rng.randint(0, 6)))
    cut = rng.randint(0, len(text))
    return text[:cut] + bad + text[cut:]


def _sample_level_case(rng: random.Random) -> tuple[bytes, int, str]:
    """A samples block (and count) broken in one way, with the expected reason."""
    good = rand_samples(rng, 3)
    prefix = raw_block(good)
    n = len(good) + 1
    kind = rng.randrange(17)
    if kind == 0:
        bad, why = u16(0) + raw_sample(b"m")[2:], "metric name length 0"
    elif kind == 1:
        size = rng.randint(MAX_METRIC_BYTES + 1, 65535)
        bad, why = u16(size) + b"m" * min(size, 300), f"metric name length {size}"
    elif kind == 2:
        bad, why = raw_sample(_poison(rng, rng.choice(INVALID_UTF8))), "metric name is not valid UTF-8"
    elif kind == 3:
        bad, why = raw_sample(_poison(rng, rng.choice(CONTROL))), "metric name contains a control character"
    elif kind == 4:
        count = rng.randint(MAX_LABELS + 1, 65535)
        bad, why = u16(1) + b"m" + u16(count), f"{count} labels, over the limit"
    elif kind == 5:
        bad, why = u16(1) + b"m" + u16(1) + u16(0) + u16(0), "label key length 0"
    elif kind == 6:
        size = rng.randint(MAX_LABEL_KEY_BYTES + 1, 65535)
        bad, why = u16(1) + b"m" + u16(1) + u16(size) + b"k" * min(size, 300), f"label key length {size}"
    elif kind == 7:
        size = rng.randint(MAX_LABEL_VALUE_BYTES + 1, 65535)
        bad, why = u16(1) + b"m" + u16(1) + u16(1) + b"k" + u16(size) + b"v" * 1100, f"label value length {size}"
    elif kind == 8:
        bad, why = raw_sample(b"m", [(_poison(rng, rng.choice(INVALID_UTF8)), b"v")]), "label key is not valid UTF-8"
    elif kind == 9:
        bad, why = raw_sample(b"m", [(b"k", _poison(rng, rng.choice(INVALID_UTF8)))]), "label value is not valid UTF-8"
    elif kind == 10:
        bad, why = raw_sample(b"m", [(_poison(rng, rng.choice(CONTROL)), b"v")]), "label key contains a control"
    elif kind == 11:
        bad, why = raw_sample(b"m", [(b"k", _poison(rng, rng.choice(CONTROL)))]), "label value contains a control"
    elif kind == 12:
        keys = sorted(rng.sample([b"a", b"b", b"c", b"host", b"z", "é".encode()], 3))
        keys[0], keys[-1] = keys[-1], keys[0]
        bad, why = raw_sample(b"m", [(k, b"") for k in keys]), "unsorted label key"
    elif kind == 13:
        key = rng.choice([b"a", b"host", "é".encode()])
        bad, why = raw_sample(b"m", [(key, b"1"), (key, b"2")]), "duplicate label key"
    elif kind == 14:
        whole = raw_sample(b"metric", [(b"k", b"v")])
        bad, why = whole[: rng.randrange(len(whole))], "truncated in samples block"
    elif kind == 15:  # more samples declared than present
        return prefix, len(good) + rng.randint(1, 2**32 - 1 - len(good)) if rng.random() < 0.3 else len(good) + 1, "truncated in samples block"
    else:  # fewer samples declared than present, or junk after the last one
        extra = bytes(rng.randrange(256) for _ in range(rng.randint(1, 30)))
        return prefix + extra, len(good), "left over in samples block"
    return prefix + bad, n, why


def _hostile_case(rng: random.Random) -> Case:
    """A frame with a valid CRC whose content breaks one rule."""
    samples = rand_samples(rng, 3)
    block, n = raw_block(samples), len(samples)
    kind = rng.randrange(16)
    if kind in (0, 1, 2, 3):
        block, n, why = _sample_level_case(rng)
        if n > MAX_SAMPLES:  # a huge declared count is rejected before the block is read
            why = "sample_count"
        return raw_frame(block, n, compress=kind >= 2), why
    if kind == 4:
        flags = rng.choice([1 << rng.randint(1, 15), rng.randint(2, 0xFFFF) & ~1 or 2])
        return raw_frame(block, n, flags=flags | rng.randint(0, 1)), "unknown flags"
    if kind == 5:
        if rng.random() < 0.5:
            wire = rng.choice([0, *range(2, 256)])
            return raw_frame(block, n, wire=wire), f"unsupported wire version {wire}"
        version = rng.choice([0, *range(2, 256)])
        return raw_frame(block, n, version=version), f"unsupported frame version {version}"
    if kind == 6:
        field = rng.choice(["agent", "boot"])
        size = rng.choice([0, rng.randint(MAX_ID_BYTES + 1, 255)])
        return raw_frame(block, n, **{field: b"i" * size}), f"{field}_id length {size}"  # type: ignore[arg-type]
    if kind == 7:
        field = rng.choice(["agent", "boot"])
        bad, why = rng.choice([(b"/", "'/'"), (rng.choice(CONTROL), "control character"), (rng.choice(INVALID_UTF8), "not valid UTF-8")])
        return raw_frame(block, n, **{field: _poison(rng, bad)}), why  # type: ignore[arg-type]
    if kind == 8:
        end = rng.randint(0, 2**64 - 2)
        return raw_frame(block, n, seq=(rng.randint(end + 1, 2**64 - 1), end)), "must be <= seq_end"
    if kind == 9:
        count = rng.choice([0, rng.randint(MAX_SAMPLES + 1, 2**32 - 1)])
        return raw_frame(block, count, compress=rng.random() < 0.5), "sample_count"
    if kind == 10:
        longer = len(block) + rng.randint(1, 2**32 - 1 - len(block))
        return raw_frame(block, n, payload_len=longer), "truncated in payload"
    if kind == 11:
        return raw_frame(block, n, payload_len=rng.randrange(len(block))), "unexpected bytes between payload and checksum"
    if kind == 12:  # compressed flag on something that is not one complete zstd frame
        packed = zstd(block)
        payload, why = rng.choice(
            [
                (block, "not a zstd frame"),
                (bytes(rng.randrange(256) for _ in range(rng.randint(0, 40))), ""),
                (packed + bytes(rng.randint(1, 9)), "after the zstd frame"),
                (packed + packed, "after the zstd frame"),
                (packed[: rng.randrange(4, len(packed))], "compressed payload"),
                (b"\x50\x2a\x4d\x18" + b"\x04\x00\x00\x00abcd" + packed, "not a zstd frame"),
                (zstd(block, write_content_size=False), "does not declare its content size"),
            ]
        )
        return raw_frame(block, n, flags=FLAG_ZSTD, payload=payload), why or None
    if kind == 13:  # zstd header declares an absurd or wrong content size
        if rng.random() < 0.5:
            size = rng.randint(MAX_DECODED_PAYLOAD_BYTES + 1, 2**63)
            payload = b"\x28\xb5\x2f\xfd\xc0\x50" + size.to_bytes(8, "little") + bytes(rng.randrange(256) for _ in range(12))
            return raw_frame(block, n, flags=FLAG_ZSTD, payload=payload), f"over the {MAX_DECODED_PAYLOAD_BYTES} byte limit"
        packed = bytearray(zstd(block, write_content_size=False))
        # Rebuild the header with an explicit 4-byte content size that is off by a few bytes.
        descriptor = packed[4]
        header_len = 6 if not descriptor & 0x20 else 5
        wrong = max(0, len(block) + rng.choice([-3, -1, 1, 7, 5000]))
        packed = packed[:4] + bytes([(descriptor & 0x3F) | 0x80]) + packed[5:header_len] + wrong.to_bytes(4, "little") + packed[header_len:]
        return raw_frame(block, n, flags=FLAG_ZSTD, payload=bytes(packed)), "compressed payload"
    if kind == 14:  # the body ends inside the header, yet the CRC over it is valid
        agent = b"a" * rng.randint(1, MAX_ID_BYTES)
        header_len = 34 + len(agent) + 6
        body = raw_frame(block, n, agent=agent)[: rng.randint(MIN_FRAME_BYTES - 4, header_len - 1)]
        return with_crc(body), "truncated in header"
    # kind 15: magic replaced
    magic = bytes(rng.randrange(256) for _ in range(4))
    return raw_frame(block, n, magic=magic if magic != MAGIC else b"XXXX"), "bad magic"


def malformed_cases(rng: random.Random) -> Iterator[tuple[str, bytes, str | None]]:
    goldens = [bytes.fromhex(v["frame_hex"]) for v in GOLDEN]
    valid = goldens + [rand_frame(rng) for _ in range(12)]
    for data in valid:  # truncation at every length
        for cut in range(len(data)):
            yield "truncate", data[:cut], None
    for data in goldens[:2]:  # every single bit flip
        for bit in range(len(data) * 8):
            flipped = bytearray(data)
            flipped[bit // 8] ^= 1 << (bit % 8)
            yield "bitflip", bytes(flipped), None
    for _ in range(1500):  # 1-4 random byte corruptions, CRC not fixed
        data = bytearray(rng.choice(valid))
        for _ in range(rng.randint(1, 4)):
            pos = rng.randrange(len(data))
            data[pos] = (data[pos] + rng.randint(1, 255)) % 256
        yield "corrupt", bytes(data), None
    for _ in range(1000):
        data = rng.choice(valid)
        yield "append", data + bytes(rng.randrange(256) for _ in range(rng.randint(1, 16))), None
    for _ in range(600):
        yield "random", bytes(rng.randrange(256) for _ in range(rng.randint(0, 200))), None
    for _ in range(600):
        tail = bytes(rng.randrange(256) for _ in range(rng.randint(0, 200)))
        yield "random-header", MAGIC + b"\x01\x01" + tail, None
    for _ in range(600):  # random content behind a valid prefix and a valid CRC
        tail = bytes(rng.randrange(256) for _ in range(rng.randint(34, 200)))
        yield "random-crc", with_crc(MAGIC + b"\x01\x01" + tail), None
    for _ in range(5000):
        data, why = _hostile_case(rng)
        yield "hostile", data, why


def test_malformed_inputs_raise_only_frame_error() -> None:
    rng = random.Random(20240601)
    counts: dict[str, int] = {}
    for category, data, why in malformed_cases(rng):
        try:
            decode_frame(data)
        except FrameError as exc:
            reason = str(exc)
            assert reason, category
            if why is not None:
                assert why in reason, (category, why, reason, data.hex())
            if category == "hostile":
                assert reason != "checksum mismatch", data.hex()
        except Exception as exc:  # noqa: BLE001 - the point is that nothing else escapes
            pytest.fail(f"{category}: {type(exc).__name__}: {exc} for {data.hex()}")
        else:
            pytest.fail(f"{category}: malformed frame accepted: {data.hex()}")
        counts[category] = counts.get(category, 0) + 1
    assert sum(counts.values()) >= 10_000, counts


def test_mutated_frames_with_fixed_crc_decode_or_raise_frame_error() -> None:
    """Random structural edits with a recomputed CRC reach the deep parser; it may accept
    (a mutation can yield another valid frame) but must never raise anything else, and an
    accepted uncompressed frame must be canonical (re-encodes to the same bytes)."""
    rng = random.Random(99)
    valid = [bytes.fromhex(v["frame_hex"]) for v in GOLDEN] + [rand_frame(rng) for _ in range(20)]
    accepted = rejected = 0
    for _ in range(3000):
        body = bytearray(rng.choice(valid)[:-4])
        for _ in range(rng.randint(1, 3)):
            pos = rng.randrange(len(body))
            op = rng.randrange(5)
            if op == 0:
                body[pos] = rng.randrange(256)
            elif op == 1:
                body.insert(pos, rng.randrange(256))
            elif op == 2 and len(body) > 1:
                del body[pos]
            elif op == 3:
                body[pos : pos + 2] = u16(rng.choice([0, 1, 0xFFFF, rng.randrange(65536)]))
            else:
                body[pos : pos + 4] = u32(rng.choice([0, 1, 0xFFFFFFFF, rng.randrange(2**32)]))
        data = with_crc(bytes(body))
        try:
            frame = decode_frame(data)
        except FrameError:
            rejected += 1
            continue
        except Exception as exc:  # noqa: BLE001
            pytest.fail(f"{type(exc).__name__}: {exc} for {data.hex()}")
        accepted += 1
        if not frame.compressed and not any(math.isnan(s.value) for s in frame.samples):
            assert encode_frame(frame.identity, frame.samples) == data
    assert rejected > 2000


# --------------------------------------------------------------------------- JSON input


@pytest.mark.parametrize(
    ("obj", "reason"),
    [
        ([], "must be a JSON object"),
        ({"ts_unix_ns": 1, "value": 1}, "missing 'metric'"),
        ({"metric": "m", "value": 1}, "missing 'ts_unix_ns'"),
        ({"metric": "m", "ts_unix_ns": 1}, "missing 'value'"),
        ({"metric": 5, "ts_unix_ns": 1, "value": 1}, "metric name must be a string"),
        ({"metric": "m", "ts_unix_ns": True, "value": 1}, "ts_unix_ns must be an integer"),
        ({"metric": "m", "ts_unix_ns": 1.5, "value": 1}, "ts_unix_ns must be an integer"),
        ({"metric": "m", "ts_unix_ns": "1", "value": 1}, "ts_unix_ns must be an integer"),
        ({"metric": "m", "ts_unix_ns": 1, "value": "1"}, "value must be a number"),
        ({"metric": "m", "ts_unix_ns": 1, "value": None}, "value must be a number"),
        ({"metric": "m", "ts_unix_ns": 1, "value": True}, "value must be a number"),
        ({"metric": "m", "labels": [], "ts_unix_ns": 1, "value": 1}, "labels must be an object"),
        ({"metric": "m", "labels": {"k": 1}, "ts_unix_ns": 1, "value": 1}, "label 'k' value must be a string"),
        ({"metric": "m", "labels": {"k\t": "v"}, "ts_unix_ns": 1, "value": 1}, "control character (U+0009)"),
        ({"metric": "m", "ts": 1, "ts_unix_ns": 1, "value": 1}, "unknown sample field(s): ts"),
        ({"metric": "", "ts_unix_ns": 1, "value": 1}, "metric name must be 1-256 bytes"),
    ],
)
def test_sample_from_json_errors(obj: object, reason: str) -> None:
    with pytest.raises(FrameError) as info:
        Sample.from_json(obj)
    assert reason in str(info.value)


def test_sample_json_round_trip() -> None:
    obj = {"metric": "cpu", "labels": {"b": "2", "a": "1"}, "ts_unix_ns": -5, "value": 2}
    sample = Sample.from_json(obj)
    assert sample == Sample("cpu", {"a": "1", "b": "2"}, -5, 2.0)
    assert sample.to_json() == {"metric": "cpu", "labels": {"a": "1", "b": "2"}, "ts_unix_ns": -5, "value": 2.0}
    assert Sample.from_json(sample.to_json()) == sample
    assert Sample.from_json({"metric": "up", "ts_unix_ns": 0, "value": 0.5}).labels == ()


def test_load_samples_jsonl() -> None:
    lines = [
        '{"metric": "up", "ts_unix_ns": 1, "value": 1}\n',
        "\n",
        "   \n",
        '{"metric": "cpu", "labels": {"host": "a"}, "ts_unix_ns": 2, "value": 0.5}\n',
    ]
    assert load_samples_jsonl(lines) == [Sample("up", {}, 1, 1.0), Sample("cpu", {"host": "a"}, 2, 0.5)]
    assert load_samples_jsonl([]) == []


@pytest.mark.parametrize(
    ("bad_line", "reason"),
    [
        ("{not json", "line 3: invalid JSON"),
        ('{"metric": "up", "ts_unix_ns": 1}', "line 3: sample is missing 'value'"),
        ('{"metric": "up", "metric": "x", "ts_unix_ns": 1, "value": 1}', "line 3: duplicate JSON key 'metric'"),
        ('{"metric": "up", "labels": {"a": "1", "a": "2"}, "ts_unix_ns": 1, "value": 1}', "line 3: duplicate JSON key 'a'"),
        ("[1, 2]", "line 3: a sample must be a JSON object"),
        ('{"metric": "up", "ts_unix_ns": 1' + "0" * 5000 + ', "value": 1}', "line 3: invalid JSON"),
    ],
)
def test_load_samples_jsonl_names_line(bad_line: str, reason: str) -> None:
    lines = ['{"metric": "up", "ts_unix_ns": 1, "value": 1}', "", bad_line]
    with pytest.raises(FrameError) as info:
        load_samples_jsonl(lines)
    assert str(info.value).startswith(reason)


# --------------------------------------------------------------------------- summary


def test_summarize_frame() -> None:
    vector = GOLDEN[1]
    data = bytes.fromhex(vector["frame_hex"])
    summary = summarize_frame(decode_frame(data), data)
    assert summary == {
        "agent_id": "agent-a",
        "boot_id": "boot-1",
        "seq_start": 2,
        "seq_end": 3,
        "manifest_id": BatchIdentity.create("agent-a", "boot-1", 2, 3).manifest_id,
        "wire_version": 1,
        "frame_version": 1,
        "flags": 0,
        "compressed": False,
        "sample_count": 2,
        "frame_bytes": 176,
        "frame_sha256": vector["frame_sha256"],
        "metrics": ["cpu_seconds_total", "http_requests_total"],
        "ts_min_ns": 1700000000000000000,
        "ts_max_ns": 1700000001000000000,
    }
    json.dumps(summary)  # JSON-ready
    compressed = bytes.fromhex(GOLDEN[2]["frame_hex"])
    assert summarize_frame(decode_frame(compressed), compressed)["compressed"] is True
