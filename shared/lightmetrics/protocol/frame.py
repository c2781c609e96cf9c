"""Lightmetrics frame v1: the canonical binary encoding of one metric batch.

Pure functions, no I/O. The sha256 of a frame's exact bytes is the batch's content hash, so
:func:`encode_frame` is deterministic: the same identity, samples and ``compress`` flag always
give the same bytes. :func:`decode_frame` validates everything and raises only
:class:`~lightmetrics.protocol.errors.FrameError`. The normative spec is ``docs/frame-format.md``.

Example:
    >>> ident = BatchIdentity.create("agent-a", "boot-1", 1, 1)
    >>> data = encode_frame(ident, [Sample("cpu", {"host": "a"}, 0, 0.5)])
    >>> decode_frame(data).samples[0].labels
    (('host', 'a'),)
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import struct
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

import zstandard

from lightmetrics.protocol.errors import FrameError, InvalidIdentityError
from lightmetrics.protocol.identity import MAX_ID_BYTES, BatchIdentity, validate_id

__all__ = [
    "FLAG_ZSTD",
    "FRAME_VERSION",
    "KNOWN_FLAGS",
    "MAGIC",
    "MAX_DECODED_PAYLOAD_BYTES",
    "MAX_LABEL_KEY_BYTES",
    "MAX_LABEL_VALUE_BYTES",
    "MAX_LABELS",
    "MAX_METRIC_BYTES",
    "MAX_SAMPLES",
    "MIN_FRAME_BYTES",
    "WIRE_VERSION",
    "ZSTD_LEVEL",
    "Frame",
    "Sample",
    "decode_frame",
    "encode_frame",
    "load_samples_jsonl",
    "summarize_frame",
    "validate_frame",
]

MAGIC = b"LMF1"
WIRE_VERSION = 1
FRAME_VERSION = 1
FLAG_ZSTD = 0x0001
KNOWN_FLAGS = FLAG_ZSTD
ZSTD_LEVEL = 3

MAX_SAMPLES = 200_000
MAX_METRIC_BYTES = 256
MAX_LABELS = 64
MAX_LABEL_KEY_BYTES = 256
MAX_LABEL_VALUE_BYTES = 1024
MAX_DECODED_PAYLOAD_BYTES = 16 * 1024 * 1024
I64_MIN = -(2**63)
I64_MAX = 2**63 - 1

# magic, 2 versions, flags, two 1-byte id lengths (ids >= 1 byte each), 2 seqs, count,
# payload_length, crc: the smallest byte string that can have a valid layout.
MIN_FRAME_BYTES = 4 + 1 + 1 + 2 + (1 + 1) * 2 + 8 + 8 + 4 + 4 + 4

CANONICAL_NAN = b"\x7f\xf8\x00\x00\x00\x00\x00\x00"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"

_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")
_TS_VALUE = struct.Struct(">qd")
_FIXED_PREFIX = struct.Struct(">4sBBH")  # magic, wire_version, frame_version, flags
_SEQ_COUNT_LEN = struct.Struct(">QQII")  # seq_start, seq_end, sample_count, payload_length

_CONTROL_CHARS = re.compile("[\x00-\x1f\x7f-\x9f]")
_JSON_KEYS = frozenset({"metric", "labels", "ts_unix_ns", "value"})


# --------------------------------------------------------------------------- samples


def _text_bytes(value: object, what: str, min_len: int, max_len: int) -> bytes:
    """UTF-8 of ``value`` after the text rules (str, length in bytes, no control chars)."""
    if not isinstance(value, str):
        raise FrameError(f"{what} must be a string")
    try:
        raw = value.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates cannot go on the wire
        raise FrameError(f"{what} is not valid UTF-8") from None
    if not min_len <= len(raw) <= max_len:
        raise FrameError(f"{what} must be {min_len}-{max_len} bytes of UTF-8, got {len(raw)}")
    bad = _CONTROL_CHARS.search(value)
    if bad:
        raise FrameError(f"{what} contains a control character (U+{ord(bad.group()):04X})")
    return raw


def _f64_bytes(value: float) -> bytes:
    # Every NaN is written as one bit pattern so equal samples always give equal bytes.
    return CANONICAL_NAN if math.isnan(value) else _F64.pack(value)


def _normalize_labels(labels: object) -> tuple[tuple[str, str], ...]:
    """Sorted ``(key, value)`` pairs from a mapping or an iterable of pairs."""
    if isinstance(labels, Mapping):
        pairs = list(labels.items())
    elif isinstance(labels, (str, bytes)) or not isinstance(labels, Iterable):
        raise FrameError("labels must be a mapping of strings to strings")
    else:
        pairs = []
        for pair in labels:
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise FrameError("labels must be a mapping of strings to strings")
            pairs.append(pair)
    if len(pairs) > MAX_LABELS:
        raise FrameError(f"a sample has at most {MAX_LABELS} labels, got {len(pairs)}")
    keyed = []
    for key, value in pairs:
        raw_key = _text_bytes(key, "label key", 1, MAX_LABEL_KEY_BYTES)
        _text_bytes(value, f"label {key!r} value", 0, MAX_LABEL_VALUE_BYTES)
        keyed.append((raw_key, key, value))
    keyed.sort()  # by key bytes: the wire order
    for (prev, _, _), (cur, key, _) in zip(keyed, keyed[1:]):
        if prev == cur:
            raise FrameError(f"duplicate label key {key!r}")
    return tuple((key, value) for _, key, value in keyed)


@dataclass(frozen=True, eq=False, slots=True)
class Sample:
    """One metric sample; validated on construction (raises FrameError).

    ``labels`` may be given as a mapping or pairs; it is stored as pairs sorted by key bytes.
    Equality and hashing compare the encoded value bits, so ``0.0 != -0.0`` and NaN == NaN.

    Example:
        >>> Sample("cpu", {"b": "2", "a": "1"}, 5, 1).labels
        (('a', '1'), ('b', '2'))
    """

    metric: str
    labels: tuple[tuple[str, str], ...] = field(default=())
    ts_unix_ns: int = 0
    value: float = 0.0

    def __post_init__(self) -> None:
        _text_bytes(self.metric, "metric name", 1, MAX_METRIC_BYTES)
        object.__setattr__(self, "labels", _normalize_labels(self.labels))
        ts = self.ts_unix_ns
        if isinstance(ts, bool) or not isinstance(ts, int):
            raise FrameError("ts_unix_ns must be an integer")
        if not I64_MIN <= ts <= I64_MAX:
            raise FrameError(f"ts_unix_ns must fit a signed 64-bit integer, got {ts}")
        value = self.value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise FrameError("value must be a number")
        try:
            object.__setattr__(self, "value", float(value))
        except OverflowError:
            raise FrameError("value is too large for a 64-bit float") from None

    @classmethod
    def _trusted(cls, metric: str, labels: tuple[tuple[str, str], ...], ts_unix_ns: int, value: float) -> Sample:
        # For the decoder only: it has already checked every rule on the wire bytes, and
        # re-validating here would double the cost of decoding a large batch.
        sample = object.__new__(cls)
        object.__setattr__(sample, "metric", metric)
        object.__setattr__(sample, "labels", labels)
        object.__setattr__(sample, "ts_unix_ns", ts_unix_ns)
        object.__setattr__(sample, "value", value)
        return sample

    def _key(self) -> tuple[str, tuple[tuple[str, str], ...], int, bytes]:
        return (self.metric, self.labels, self.ts_unix_ns, _f64_bytes(self.value))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sample):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    @property
    def label_map(self) -> dict[str, str]:
        """The labels as a fresh dict."""
        return dict(self.labels)

    @classmethod
    def from_json(cls, obj: object) -> Sample:
        """Build a sample from a decoded JSON object; raise FrameError naming the bad field.

        Example:
            >>> Sample.from_json({"metric": "up", "ts_unix_ns": 1, "value": 1}).value
            1.0
        """
        if not isinstance(obj, dict):
            raise FrameError("a sample must be a JSON object")
        unknown = sorted(str(k) for k in obj.keys() - _JSON_KEYS)
        if unknown:
            raise FrameError(f"unknown sample field(s): {', '.join(unknown)}")
        for key in ("metric", "ts_unix_ns", "value"):
            if key not in obj:
                raise FrameError(f"sample is missing {key!r}")
        labels = obj.get("labels", {})
        if not isinstance(labels, dict):
            raise FrameError("labels must be an object of strings")
        for key, value in labels.items():
            if not isinstance(value, str):
                raise FrameError(f"label {key!r} value must be a string")
        return cls(obj["metric"], labels, obj["ts_unix_ns"], obj["value"])  # type: ignore[arg-type]

    def to_json(self) -> dict[str, Any]:
        """The inverse of :meth:`from_json` (non-finite values stay Python floats)."""
        return {
            "metric": self.metric,
            "labels": dict(self.labels),
            "ts_unix_ns": self.ts_unix_ns,
            "value": self.value,
        }


def load_samples_jsonl(lines: Iterable[str]) -> list[Sample]:
    """Parse one JSON sample per non-blank line; FrameError messages name the 1-based line.

    Example:
        >>> load_samples_jsonl(['{"metric": "up", "ts_unix_ns": 1, "value": 1}', ""])[0].metric
        'up'
    """
    samples: list[Sample] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line, object_pairs_hook=_reject_duplicate_keys)
        except json.JSONDecodeError as exc:
            raise FrameError(f"line {number}: invalid JSON: {exc.msg} (column {exc.colno})") from None
        except FrameError as exc:
            raise FrameError(f"line {number}: {exc}") from None
        except (ValueError, RecursionError):  # e.g. integer strings over the int-digit limit
            raise FrameError(f"line {number}: invalid JSON") from None
        try:
            samples.append(Sample.from_json(obj))
        except FrameError as exc:
            raise FrameError(f"line {number}: {exc}") from None
    return samples


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json.loads silently keeps the last duplicate; a repeated label key is almost always a bug.
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise FrameError(f"duplicate JSON key {key!r}")
        obj[key] = value
    return obj


# --------------------------------------------------------------------------- frames


@dataclass(frozen=True, slots=True)
class Frame:
    """A decoded, fully validated frame.

    Example:
        >>> frame = decode_frame(encode_frame(BatchIdentity.create("a", "b", 0, 0), [Sample("up")]))
        >>> (frame.compressed, len(frame.samples))
        (False, 1)
    """

    identity: BatchIdentity
    flags: int
    samples: tuple[Sample, ...]
    wire_version: int = WIRE_VERSION
    frame_version: int = FRAME_VERSION

    @property
    def compressed(self) -> bool:
        return bool(self.flags & FLAG_ZSTD)


def _checked_identity(identity: object) -> BatchIdentity:
    # BatchIdentity(...) can be built without create(); never put an unvalidated id on the wire.
    if not isinstance(identity, BatchIdentity):
        raise FrameError("identity must be a BatchIdentity")
    try:
        return BatchIdentity.create(identity.agent_id, identity.boot_id, identity.seq_start, identity.seq_end)
    except InvalidIdentityError as exc:
        raise FrameError(str(exc)) from None


def _encode_samples(samples: Iterable[Sample]) -> tuple[bytes, int]:
    out = bytearray()
    count = 0
    for sample in samples:
        if not isinstance(sample, Sample):
            raise FrameError(f"sample {count} is a {type(sample).__name__}, not a Sample")
        count += 1
        if count > MAX_SAMPLES:
            raise FrameError(f"a frame holds at most {MAX_SAMPLES} samples")
        metric = sample.metric.encode("utf-8")
        out += _U16.pack(len(metric)) + metric + _U16.pack(len(sample.labels))
        for key, value in sample.labels:
            raw_key, raw_value = key.encode("utf-8"), value.encode("utf-8")
            out += _U16.pack(len(raw_key)) + raw_key + _U16.pack(len(raw_value)) + raw_value
        out += _I64.pack(sample.ts_unix_ns) + _f64_bytes(sample.value)
    if count == 0:
        raise FrameError("a frame must hold at least 1 sample")
    if len(out) > MAX_DECODED_PAYLOAD_BYTES:
        raise FrameError(f"samples block is {len(out)} bytes, over the {MAX_DECODED_PAYLOAD_BYTES} byte limit")
    return bytes(out), count


def encode_frame(identity: BatchIdentity, samples: Iterable[Sample], *, compress: bool = False) -> bytes:
    """Encode a batch as canonical frame v1 bytes; raise FrameError on invalid input.

    Example:
        >>> encode_frame(BatchIdentity.create("a", "b", 0, 0), [Sample("up", {}, 0, 1.0)])[:4]
        b'LMF1'
    """
    ident = _checked_identity(identity)
    block, count = _encode_samples(samples)
    flags = FLAG_ZSTD if compress else 0
    if compress:
        compressor = zstandard.ZstdCompressor(
            level=ZSTD_LEVEL, write_content_size=True, write_checksum=False, write_dict_id=False
        )
        payload = compressor.compress(block)
    else:
        payload = block
    agent = ident.agent_id.encode("utf-8")
    boot = ident.boot_id.encode("utf-8")
    body = b"".join(
        (
            _FIXED_PREFIX.pack(MAGIC, WIRE_VERSION, FRAME_VERSION, flags),
            _U8.pack(len(agent)),
            agent,
            _U8.pack(len(boot)),
            boot,
            _SEQ_COUNT_LEN.pack(ident.seq_start, ident.seq_end, count, len(payload)),
            payload,
        )
    )
    return body + _U32.pack(zlib.crc32(body))


class _Reader:
    """Bounds-checked big-endian reads of the header; an overrun is "truncated in header"."""

    __slots__ = ("buf", "pos", "end")

    def __init__(self, buf: bytes, end: int) -> None:
        self.buf, self.pos, self.end = buf, 0, end

    def fail(self) -> NoReturn:
        raise FrameError("truncated in header")

    def take(self, size: int) -> bytes:
        start, stop = self.pos, self.pos + size
        if stop > self.end:
            self.fail()
        self.pos = stop
        return self.buf[start:stop]

    def unpack(self, fmt: struct.Struct) -> tuple[Any, ...]:
        start = self.pos
        if start + fmt.size > self.end:
            self.fail()
        self.pos = start + fmt.size
        return fmt.unpack_from(self.buf, start)

    @property
    def remaining(self) -> int:
        return self.end - self.pos


def _wire_text(raw: bytes, what: str) -> str:
    """Decode wire bytes under the text rules (strict UTF-8, no control chars)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise FrameError(f"{what} is not valid UTF-8") from None
    bad = _CONTROL_CHARS.search(text)
    if bad:
        raise FrameError(f"{what} contains a control character (U+{ord(bad.group()):04X})")
    return text


def _decompress(payload: bytes) -> bytes:
    """The samples block inside a zstd payload, never more than MAX_DECODED_PAYLOAD_BYTES."""
    if not payload.startswith(_ZSTD_MAGIC):
        raise FrameError("compressed payload is not a zstd frame")
    try:
        size = zstandard.frame_content_size(payload)
    except zstandard.ZstdError:
        raise FrameError("compressed payload has a bad zstd frame header") from None
    if size < 0:
        raise FrameError("compressed payload does not declare its content size")
    if size > MAX_DECODED_PAYLOAD_BYTES:
        raise FrameError(f"compressed payload declares {size} bytes, over the {MAX_DECODED_PAYLOAD_BYTES} byte limit")
    try:
        # libzstd stops with an error as soon as output disagrees with the declared size,
        # so the checked size above also bounds memory; the window cap bounds the buffer.
        dctx = zstandard.ZstdDecompressor(max_window_size=MAX_DECODED_PAYLOAD_BYTES)
        dobj = dctx.decompressobj()
        block = dobj.decompress(payload)
    except (zstandard.ZstdError, MemoryError):
        raise FrameError("compressed payload is corrupt") from None
    if not dobj.eof or len(block) != size:
        raise FrameError("compressed payload is truncated")
    if dobj.unused_data:
        raise FrameError(f"{len(dobj.unused_data)} bytes after the zstd frame in the payload")
    return block


def _decode_samples(block: bytes, count: int) -> tuple[Sample, ...]:
    """Parse exactly ``count`` samples from ``block``; every length is checked before use."""
    end = len(block)
    pos = 0
    # Batches repeat names, labels and label sets: check/decode each distinct one once and
    # share the objects, which is most of the speed and bounds memory on repetitive input.
    texts: dict[bytes, str] = {}
    label_sets: dict[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]] = {}
    samples: list[Sample] = []
    u16 = _U16.unpack_from
    ts_value = _TS_VALUE.unpack_from

    def text(start: int, length: int, what: str) -> str:
        raw = block[start : start + length]
        if len(raw) != length:
            raise FrameError("truncated in samples block")
        cached = texts.get(raw)
        if cached is None:
            cached = texts[raw] = _wire_text(raw, what)
        return cached

    for index in range(count):
        try:
            if pos + 2 > end:
                raise FrameError("truncated in samples block")
            (metric_len,) = u16(block, pos)
            if not 1 <= metric_len <= MAX_METRIC_BYTES:
                raise FrameError(f"metric name length {metric_len} is outside 1-{MAX_METRIC_BYTES}")
            metric = text(pos + 2, metric_len, "metric name")
            pos += 2 + metric_len
            if pos + 2 > end:
                raise FrameError("truncated in samples block")
            (label_count,) = u16(block, pos)
            pos += 2
            if label_count > MAX_LABELS:
                raise FrameError(f"{label_count} labels, over the limit of {MAX_LABELS}")
            labels: list[tuple[str, str]] = []
            prev_key = b""
            for _ in range(label_count):
                if pos + 2 > end:
                    raise FrameError("truncated in samples block")
                (key_len,) = u16(block, pos)
                if not 1 <= key_len <= MAX_LABEL_KEY_BYTES:
                    raise FrameError(f"label key length {key_len} is outside 1-{MAX_LABEL_KEY_BYTES}")
                key = text(pos + 2, key_len, "label key")
                raw_key = block[pos + 2 : pos + 2 + key_len]
                # Strictly increasing key bytes is what makes the block canonical.
                if raw_key <= prev_key:
                    what = "duplicate" if raw_key == prev_key else "unsorted"
                    raise FrameError(f"{what} label key {key!r}")
                prev_key = raw_key
                pos += 2 + key_len
                if pos + 2 > end:
                    raise FrameError("truncated in samples block")
                (value_len,) = u16(block, pos)
                if value_len > MAX_LABEL_VALUE_BYTES:
                    raise FrameError(f"label value length {value_len} is over {MAX_LABEL_VALUE_BYTES}")
                labels.append((key, text(pos + 2, value_len, "label value")))
                pos += 2 + value_len
            if pos + 16 > end:
                raise FrameError("truncated in samples block")
            ts, value = ts_value(block, pos)
            pos += 16
        except FrameError as exc:
            raise FrameError(f"{exc} (sample {index})") from None
        label_tuple = tuple(labels)
        samples.append(Sample._trusted(metric, label_sets.setdefault(label_tuple, label_tuple), ts, value))
    if pos != end:
        raise FrameError(f"{end - pos} bytes left over in samples block after {count} samples")
    return tuple(samples)


def decode_frame(data: bytes, *, max_frame_bytes: int | None = None) -> Frame:
    """Decode and fully validate frame bytes; raise only FrameError, with a short reason.

    Example:
        >>> decode_frame(b"nope")
        Traceback (most recent call last):
        ...
        lightmetrics.protocol.errors.FrameError: bad magic
    """
    identity, flags, count, block, wire_version, frame_version = _checked_header(data, max_frame_bytes)
    return Frame(identity, flags, _decode_samples(block, count), wire_version, frame_version)


def samples_block(data: bytes) -> tuple[int, bytes]:
    """``(sample_count, samples block)`` of a frame, header and payload fully checked (checksum,
    versions, lengths, identity, decompression bounds) but the samples not decoded: for readers
    that scan the block's records themselves (the rollup's vectorized decoder).

    Example:
        >>> samples_block(b"nope")
        Traceback (most recent call last):
        ...
        lightmetrics.protocol.errors.FrameError: bad magic
    """
    _, _, count, block, _, _ = _checked_header(data, None)
    return count, block


def _checked_header(data: bytes, max_frame_bytes: int | None
                    ) -> tuple[BatchIdentity, int, int, bytes, int, int]:
    """Everything of :func:`decode_frame` but the samples: (identity, flags, count, block, wire, frame)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise FrameError(f"frame must be bytes, not {type(data).__name__}")
    data = bytes(data)
    size = len(data)
    if max_frame_bytes is not None and size > max_frame_bytes:
        raise FrameError(f"frame is {size} bytes, over the {max_frame_bytes} byte limit")
    if data[:4] != MAGIC:
        raise FrameError("truncated in magic" if size < 4 and MAGIC.startswith(data) else "bad magic")
    # Versions come before the checksum: a future version may put the checksum elsewhere.
    if size >= 5 and data[4] != WIRE_VERSION:
        raise FrameError(f"unsupported wire version {data[4]}")
    if size >= 6 and data[5] != FRAME_VERSION:
        raise FrameError(f"unsupported frame version {data[5]}")
    if size < MIN_FRAME_BYTES:
        raise FrameError(f"truncated in header ({size} bytes, a frame has at least {MIN_FRAME_BYTES})")
    # Checksum before any parsing: random corruption and truncation are rejected cheaply.
    (stored_crc,) = _U32.unpack_from(data, size - 4)
    if zlib.crc32(memoryview(data)[: size - 4]) != stored_crc:
        raise FrameError("checksum mismatch")

    # From here the bytes are intact but may still be hostile: every length is checked.
    reader = _Reader(data, size - 4)
    _, wire_version, frame_version, flags = reader.unpack(_FIXED_PREFIX)
    if flags & ~KNOWN_FLAGS:
        raise FrameError(f"unknown flags 0x{flags & ~KNOWN_FLAGS:04x}")
    (agent_len,) = reader.unpack(_U8)
    agent_id = _header_id(reader, agent_len, "agent_id")
    (boot_len,) = reader.unpack(_U8)
    boot_id = _header_id(reader, boot_len, "boot_id")
    seq_start, seq_end, count, payload_len = reader.unpack(_SEQ_COUNT_LEN)
    try:
        identity = BatchIdentity.create(agent_id, boot_id, seq_start, seq_end)
    except InvalidIdentityError as exc:
        raise FrameError(str(exc)) from None
    if not 1 <= count <= MAX_SAMPLES:
        raise FrameError(f"sample_count {count} is outside 1-{MAX_SAMPLES}")
    if payload_len > reader.remaining:
        raise FrameError(f"truncated in payload (payload_length {payload_len}, {reader.remaining} bytes present)")
    if payload_len < reader.remaining:
        raise FrameError(f"{reader.remaining - payload_len} unexpected bytes between payload and checksum")
    payload = reader.take(payload_len)
    if flags & FLAG_ZSTD:
        block = _decompress(payload)
    elif payload_len > MAX_DECODED_PAYLOAD_BYTES:
        raise FrameError(f"payload is {payload_len} bytes, over the {MAX_DECODED_PAYLOAD_BYTES} byte limit")
    else:
        block = payload
    return identity, flags, count, block, wire_version, frame_version


def _header_id(reader: _Reader, length: int, what: str) -> str:
    if not 1 <= length <= MAX_ID_BYTES:
        raise FrameError(f"{what} length {length} is outside 1-{MAX_ID_BYTES}")
    raw = reader.take(length)
    try:
        return validate_id(raw.decode("utf-8"), what)
    except UnicodeDecodeError:
        raise FrameError(f"{what} is not valid UTF-8") from None
    except InvalidIdentityError as exc:
        raise FrameError(str(exc)) from None


def validate_frame(
    data: bytes, expected: BatchIdentity | None = None, *, max_frame_bytes: int | None = None
) -> Frame:
    """:func:`decode_frame`, then require the frame identity to equal ``expected`` if given.

    Example:
        >>> ident = BatchIdentity.create("a", "b", 0, 0)
        >>> validate_frame(encode_frame(ident, [Sample("up")]), ident).identity == ident
        True
    """
    frame = decode_frame(data, max_frame_bytes=max_frame_bytes)
    if expected is not None and frame.identity != expected:
        raise FrameError(f"frame identity {frame.identity} does not match request identity {expected}")
    return frame


def summarize_frame(frame: Frame, data: bytes) -> dict[str, Any]:
    """A JSON-ready summary for ``lmctl frame inspect``; ``data`` is the frame's exact bytes.

    Example:
        >>> data = encode_frame(BatchIdentity.create("a", "b", 0, 0), [Sample("up", {}, 7, 1.0)])
        >>> summarize_frame(decode_frame(data), data)["ts_min_ns"]
        7
    """
    timestamps = [s.ts_unix_ns for s in frame.samples]
    ident = frame.identity
    return {
        "agent_id": ident.agent_id,
        "boot_id": ident.boot_id,
        "seq_start": ident.seq_start,
        "seq_end": ident.seq_end,
        "manifest_id": ident.manifest_id,
        "wire_version": frame.wire_version,
        "frame_version": frame.frame_version,
        "flags": frame.flags,
        "compressed": frame.compressed,
        "sample_count": len(frame.samples),
        "frame_bytes": len(data),
        "frame_sha256": hashlib.sha256(data).hexdigest(),
        "metrics": sorted({s.metric for s in frame.samples}),
        "ts_min_ns": min(timestamps, default=None),
        "ts_max_ns": max(timestamps, default=None),
    }

