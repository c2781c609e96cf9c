"""The key codec: every object key of the layout is built and parsed here, and nowhere else.

Keys live inside the authority's prefix namespace (``LM_PREFIX``, empty or ending in ``/``).
Builders take validated values (:class:`BatchIdentity`, :class:`UtcHour`, a sha256 hex) so a
key can only be made from input that already passed validation; :meth:`KeyCodec.parse` is the
inverse and raises :class:`KeyLayoutError` for anything outside the layout. The v2 derived layout
(index segments, sealed parts: docs/protocol.md §3) is :mod:`lightmetrics.protocol.segment_keys`.

Example:
    >>> codec = KeyCodec("prod/")
    >>> ident = BatchIdentity.create("a", "b", 1, 2)
    >>> codec.accepted(ident)
    'prod/accepted/v1/agent=61/boot=62/00000000000000000001-00000000000000000002.json'
    >>> codec.parse(codec.accepted(ident)).identity == ident
    True
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from enum import Enum
from urllib.parse import quote, unquote

from lightmetrics.protocol.errors import InvalidIdentityError, KeyLayoutError
from lightmetrics.protocol.identity import SEQ_WIDTH, BatchIdentity, hex_to_id

_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
ROLLUP_WINDOWS = ("1m", "5m", "1h")
RETENTION_SCOPES = ("raw", "rollup")
_NS_PER_HOUR = 3600 * 1_000_000_000
_METRIC_SAFE = "_.:-"  # besides ASCII letters and digits; everything else is %-encoded


def validate_sha256(value: object, field: str = "sha256") -> str:
    if not isinstance(value, str) or not _SHA_RE.match(value):
        raise KeyLayoutError(f"{field} must be 64 lowercase hex characters")
    return value


@dataclass(frozen=True, order=True, slots=True)
class UtcHour:
    """One UTC hour, the unit of every ``*-by-time`` partition, of retention and of rollups."""

    start_unix_s: int

    @classmethod
    def of_unix_ns(cls, unix_ns: int) -> "UtcHour":
        return cls((unix_ns // _NS_PER_HOUR) * 3600)

    @classmethod
    def of_datetime(cls, value: datetime) -> "UtcHour":
        if value.tzinfo is None:
            raise ValueError("datetime must be timezone-aware")
        return cls((int(value.timestamp()) // 3600) * 3600)

    @classmethod
    def parse(cls, text: str) -> "UtcHour":
        """Parse ``YYYY-MM-DDTHH`` (the CLI's ``--hour``)."""
        try:
            value = datetime.strptime(text, "%Y-%m-%dT%H").replace(tzinfo=timezone.utc)
        except ValueError:
            raise ValueError(f"hour must look like 2026-11-25T13, got {text!r}") from None
        return cls.of_datetime(value)

    @classmethod
    def from_parts(cls, date: str, hour: str) -> "UtcHour":
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", date) or not re.fullmatch(r"\d{2}", hour):
            raise KeyLayoutError(f"bad date/hour partition {date!r}/{hour!r}")
        try:
            return cls.parse(f"{date}T{hour}")
        except ValueError as exc:
            raise KeyLayoutError(str(exc)) from None

    @property
    def datetime(self) -> datetime:
        return datetime.fromtimestamp(self.start_unix_s, tz=timezone.utc)

    @property
    def date_str(self) -> str:
        return self.datetime.strftime("%Y-%m-%d")

    @property
    def hour_str(self) -> str:
        return self.datetime.strftime("%H")

    @property
    def start_ns(self) -> int:
        return self.start_unix_s * 1_000_000_000

    @property
    def end_ns(self) -> int:
        return self.start_ns + _NS_PER_HOUR

    @property
    def partition(self) -> str:
        return f"date={self.date_str}/hour={self.hour_str}"

    def next(self) -> "UtcHour":
        return UtcHour(self.start_unix_s + 3600)

    def __add__(self, hours: int) -> "UtcHour":
        return UtcHour(self.start_unix_s + 3600 * hours)

    def __str__(self) -> str:
        return self.datetime.strftime("%Y-%m-%dT%H")


class KeyKind(str, Enum):
    RAW_BLOB = "raw-blob"
    RAW_BLOBS_BY_TIME = "raw-blobs-by-time"
    ACCEPTED = "accepted"
    ACCEPTED_BY_TIME = "accepted-by-time"
    ACCEPTED_BY_BLOB = "accepted-by-blob"
    QUARANTINE = "quarantine"
    QUARANTINE_BY_BLOB = "quarantine-by-blob"
    ROLLUP_MANIFEST = "rollup-manifest"
    ROLLUP_CHUNK = "rollup-chunk"
    ROLLUP_INDEX = "rollup-index"
    ROLLUP_CHUNK_LIST = "rollup-chunk-list"
    ROLLUP_PART = "rollup-part"
    RETENTION_TOMBSTONE = "retention-tombstone"
    RETENTION_REAPED = "retention-reaped"
    CONFLICT_RESOLUTION = "conflict-resolution"
    AUDIT = "audit"


# Top-level prefixes of the layout (after the namespace), the one table of them: every other module
# asks :func:`layout_root` / :meth:`KeyCodec.root` instead of spelling one. Every write in the system
# is a create. (Entry order is :data:`LAYOUT_ROOTS`' order, which the bucket policy's resources follow.)
PREFIXES: dict[KeyKind, str] = {
    KeyKind.RAW_BLOB: "raw-blobs/v1/",
    KeyKind.RAW_BLOBS_BY_TIME: "raw-blobs-by-time/v1/",
    KeyKind.ACCEPTED: "accepted/v1/",
    KeyKind.ACCEPTED_BY_TIME: "accepted-by-time/v1/",
    KeyKind.ACCEPTED_BY_BLOB: "accepted-by-blob/v1/",
    KeyKind.QUARANTINE: "quarantine/v1/",
    KeyKind.QUARANTINE_BY_BLOB: "quarantine-by-blob/v1/",
    KeyKind.CONFLICT_RESOLUTION: "conflict-resolutions/v1/",
    KeyKind.ROLLUP_MANIFEST: "manifests/v1/",
    KeyKind.ROLLUP_CHUNK: "rollup/v1/",
    KeyKind.ROLLUP_INDEX: "index/v1/",
    KeyKind.ROLLUP_CHUNK_LIST: "manifests/v1/",
    KeyKind.ROLLUP_PART: "rollup/v1/",
    KeyKind.RETENTION_TOMBSTONE: "retention/v1/",
    KeyKind.RETENTION_REAPED: "retention/v1/",
    KeyKind.AUDIT: "audit/v1/",
}

#: Every distinct top-level prefix of the layout, relative to the namespace (several kinds share one).
LAYOUT_ROOTS: tuple[str, ...] = tuple(dict.fromkeys(PREFIXES.values()))


def layout_root(kind: KeyKind) -> str:
    """The top-level prefix of ``kind`` relative to the namespace, for what is written before the
    namespace is known (IAM resources ``bucket/${prefix}<root>*``, the bucket policy, queue filters).

    >>> layout_root(KeyKind.ACCEPTED_BY_TIME)
    'accepted-by-time/v1/'
    """
    return PREFIXES[kind]


def layout_roots(*kinds: KeyKind) -> tuple[str, ...]:
    """:func:`layout_root` of each kind, in order."""
    return tuple(PREFIXES[kind] for kind in kinds)


@dataclass(frozen=True, slots=True)
class ParsedKey:
    """What :meth:`KeyCodec.parse` learned from a key; fields not in that key family are None."""

    kind: KeyKind
    identity: BatchIdentity | None = None
    sha256: str | None = None
    hour: UtcHour | None = None
    window: str | None = None
    metric: str | None = None
    chunk_id: str | None = None
    generation: int | None = None
    scope: str | None = None
    run_id: str | None = None
    rest: str | None = None
    part: int | None = None


_ID = r"agent=(?P<agent>[0-9a-f]+)/boot=(?P<boot>[0-9a-f]+)/(?P<start>\d{%d})-(?P<end>\d{%d})" % (SEQ_WIDTH, SEQ_WIDTH)
_HOUR = r"date=(?P<date>\d{4}-\d{2}-\d{2})/hour=(?P<hour>\d{2})"
_SHA_PATH = r"sha256/(?P<h1>[0-9a-f]{2})/(?P<h2>[0-9a-f]{2})/(?P<sha>[0-9a-f]{64})"
_MID = r"(?P<agent>[0-9a-f]+)\.(?P<boot>[0-9a-f]+)\.(?P<start>\d{%d})-(?P<end>\d{%d})" % (SEQ_WIDTH, SEQ_WIDTH)

_PATTERNS: list[tuple[KeyKind, re.Pattern[str]]] = [
    (KeyKind.RAW_BLOB, re.compile(rf"raw-blobs/v1/{_SHA_PATH}\.lmbatch")),
    (KeyKind.RAW_BLOBS_BY_TIME, re.compile(rf"raw-blobs-by-time/v1/{_HOUR}/sha256=(?P<sha>[0-9a-f]{{64}})\.json")),
    (KeyKind.ACCEPTED, re.compile(rf"accepted/v1/{_ID}\.json")),
    (KeyKind.ACCEPTED_BY_TIME, re.compile(rf"accepted-by-time/v1/{_HOUR}/{_MID}\.json")),
    (KeyKind.ACCEPTED_BY_BLOB, re.compile(rf"accepted-by-blob/v1/{_SHA_PATH}/{_ID}\.json")),
    (KeyKind.QUARANTINE, re.compile(rf"quarantine/v1/identity-conflict/{_ID}/(?P<sha>[0-9a-f]{{64}})\.json")),
    (KeyKind.QUARANTINE_BY_BLOB, re.compile(rf"quarantine-by-blob/v1/{_SHA_PATH}/{_ID}\.json")),
    (KeyKind.ROLLUP_MANIFEST, re.compile(rf"manifests/v1/{_HOUR}/generation=(?P<gen>\d{{10}})\.json")),
    (
        KeyKind.ROLLUP_CHUNK,
        re.compile(
            rf"rollup/v1/window=(?P<window>1m|5m|1h)/{_HOUR}/metric=(?P<metric>[^/]+)/(?P<chunk>[0-9a-f]{{64}})\.lmrollup\.zst"
        ),
    ),
    (
        KeyKind.ROLLUP_PART,
        re.compile(
            rf"rollup/v1/window=(?P<window>1m|5m|1h)/{_HOUR}/generation=(?P<gen>\d{{10}})/part-(?P<part>\d{{5}})\."
            rf"(?P<sha>[0-9a-f]{{64}})\.parquet"
        ),
    ),
    (KeyKind.ROLLUP_INDEX, re.compile(rf"index/v1/{_HOUR}/(?P<chunk>[0-9a-f]{{64}})\.lmindex\.zst")),
    (KeyKind.ROLLUP_CHUNK_LIST, re.compile(rf"manifests/v1/{_HOUR}/chunk-lists/(?P<sha>[0-9a-f]{{64}})\.json\.zst")),
    (KeyKind.RETENTION_TOMBSTONE, re.compile(rf"retention/v1/(?P<scope>raw|rollup)/{_HOUR}/tombstone\.json")),
    (KeyKind.RETENTION_REAPED, re.compile(rf"retention/v1/(?P<scope>raw|rollup)/{_HOUR}/reaped\.json")),
    (KeyKind.CONFLICT_RESOLUTION, re.compile(rf"conflict-resolutions/v1/{_ID}/(?P<sha>[0-9a-f]{{64}})\.json")),
    (KeyKind.AUDIT, re.compile(r"audit/v1/run=(?P<run>[A-Za-z0-9_.-]{1,128})/(?P<rest>.+)")),
    (KeyKind.AUDIT, re.compile(r"audit/v1/committed/(?P<at>\d{12})\.(?P<run>[A-Za-z0-9_.-]{1,128})\.json")),
]

RUN_ID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


def _sha_path(sha: str) -> str:
    return f"sha256/{sha[0:2]}/{sha[2:4]}/{sha}"


def _id_path(identity: BatchIdentity) -> str:
    return f"agent={identity.agent_hex}/boot={identity.boot_hex}/{identity.seq_range}"


def encode_metric(metric: str) -> str:
    """Key-safe, reversible form of a metric name (percent-encoding outside ``[A-Za-z0-9_.:-]``)."""
    if not metric:
        raise KeyLayoutError("metric name must not be empty")
    return quote(metric, safe=_METRIC_SAFE)


class KeyCodec:
    """Builds and parses every key inside one prefix namespace."""

    def __init__(self, prefix: str = "") -> None:
        if prefix and not prefix.endswith("/"):
            raise KeyLayoutError("prefix namespace must be empty or end with '/'")
        self.prefix = prefix

    # -- raw blobs ---------------------------------------------------------------------------
    def raw_blob(self, sha256: str) -> str:
        sha = validate_sha256(sha256)
        return f"{self.prefix}raw-blobs/v1/{_sha_path(sha)}.lmbatch"

    def raw_blobs_by_time(self, hour: UtcHour, sha256: str) -> str:
        sha = validate_sha256(sha256)
        return f"{self.prefix}raw-blobs-by-time/v1/{hour.partition}/sha256={sha}.json"

    # -- acceptance records ------------------------------------------------------------------
    def accepted(self, identity: BatchIdentity) -> str:
        return f"{self.prefix}accepted/v1/{_id_path(identity)}.json"

    def accepted_by_time(self, hour: UtcHour, identity: BatchIdentity) -> str:
        return f"{self.prefix}accepted-by-time/v1/{hour.partition}/{identity.manifest_id}.json"

    def accepted_by_blob(self, sha256: str, identity: BatchIdentity) -> str:
        sha = validate_sha256(sha256)
        return f"{self.prefix}accepted-by-blob/v1/{_sha_path(sha)}/{_id_path(identity)}.json"

    def quarantine(self, identity: BatchIdentity, sha256: str) -> str:
        sha = validate_sha256(sha256)
        return f"{self.prefix}quarantine/v1/identity-conflict/{_id_path(identity)}/{sha}.json"

    def quarantine_id_prefix(self, id_prefix: str) -> str:
        """The key prefix under which the quarantine manifests of every conflict whose id starts
        with ``id_prefix`` lie (a conflict id is ``<agent-hex>.<boot-hex>.<seq-range>.<sha256>``).

        >>> KeyCodec("").quarantine_id_prefix("6167.62")
        'quarantine/v1/identity-conflict/agent=6167/boot=62'
        """
        parts = id_prefix.split(".", 3)
        out = f"{self.prefix}quarantine/v1/identity-conflict/agent={parts[0]}"
        for separator, part in zip(("/boot=", "/", "/"), parts[1:]):
            out += separator + part
        return out

    def quarantine_by_blob(self, sha256: str, identity: BatchIdentity) -> str:
        sha = validate_sha256(sha256)
        return f"{self.prefix}quarantine-by-blob/v1/{_sha_path(sha)}/{_id_path(identity)}.json"

    def conflict_resolution(self, identity: BatchIdentity, sha256: str) -> str:
        sha = validate_sha256(sha256)
        return f"{self.prefix}conflict-resolutions/v1/{_id_path(identity)}/{sha}.json"

    # -- roots and partitions (listings, walks, reaps) ----------------------------------------
    def root(self, kind: KeyKind) -> str:
        """The namespace's prefix of every key of ``kind`` (and of the kinds sharing its root).

        >>> KeyCodec("prod/").root(KeyKind.RAW_BLOB)
        'prod/raw-blobs/v1/'
        """
        return self.prefix + PREFIXES[kind]

    def accepted_root(self) -> str:
        return self.root(KeyKind.ACCEPTED)

    @staticmethod
    def agent_prefix(root: str, agent_hex: str) -> str:
        """One agent's keys under ``root`` (:meth:`accepted_root` or :meth:`quarantine_root`).

        >>> KeyCodec("").agent_prefix(KeyCodec("").accepted_root(), "6131")
        'accepted/v1/agent=6131/'
        """
        return f"{root}agent={agent_hex}/"

    def quarantine_root(self) -> str:
        return f"{self.prefix}quarantine/v1/identity-conflict/"

    def accepted_by_time_hour(self, hour: UtcHour) -> str:
        return f"{self.prefix}accepted-by-time/v1/{hour.partition}/"

    def raw_blobs_by_time_hour(self, hour: UtcHour) -> str:
        return f"{self.prefix}raw-blobs-by-time/v1/{hour.partition}/"

    def retention_scope_root(self, scope: str) -> str:
        """Prefix of every retention marker (tombstone, reaped) of one scope."""
        return f"{self.prefix}retention/v1/{_scope(scope)}/"

    # -- rollups -----------------------------------------------------------------------------
    def rollup_manifest(self, hour: UtcHour, generation: int) -> str:
        if not 0 <= generation < 10**10:
            raise KeyLayoutError("generation must be in [0, 10^10)")
        return f"{self.prefix}manifests/v1/{hour.partition}/generation={generation:010d}.json"

    def rollup_manifest_hour(self, hour: UtcHour) -> str:
        """Prefix of every generation manifest of one hour."""
        return f"{self.prefix}manifests/v1/{hour.partition}/"

    def rollup_chunk_list(self, hour: UtcHour, sha256: str) -> str:
        """A generation's chunk list, named by the sha256 of its bytes (under the hour's manifests,
        in a folder of its own: a delimited listing of the manifests does not return it)."""
        return f"{self.prefix}manifests/v1/{hour.partition}/chunk-lists/{validate_sha256(sha256)}.json.zst"

    def rollup_chunk(self, window: str, hour: UtcHour, metric: str, chunk_id: str) -> str:
        if window not in ROLLUP_WINDOWS:
            raise KeyLayoutError(f"window must be one of {ROLLUP_WINDOWS}")
        cid = validate_sha256(chunk_id, "chunk_id")
        return f"{self.prefix}rollup/v1/window={window}/{hour.partition}/metric={encode_metric(metric)}/{cid}.lmrollup.zst"

    def rollup_part(self, window: str, hour: UtcHour, generation: int, part: int, sha256: str) -> str:
        """A v3 rollup object: the Parquet rows of every series of one generation of ``hour`` whose
        metric falls in ``part``, for ``window`` (docs/pipeline.md §6), named by the sha256 of its bytes.

        >>> KeyCodec().rollup_part("5m", UtcHour(0), 2, 7, "ab" * 32)[:76]
        'rollup/v1/window=5m/date=1970-01-01/hour=00/generation=0000000002/part-00007'
        """
        if window not in ROLLUP_WINDOWS:
            raise KeyLayoutError(f"window must be one of {ROLLUP_WINDOWS}")
        if not 0 <= generation < 10**10 or not 0 <= part < 10**5:
            raise KeyLayoutError("generation must be in [0, 10^10) and part in [0, 10^5)")
        return (f"{self.prefix}rollup/v1/window={window}/{hour.partition}/generation={generation:010d}/"
                f"part-{part:05d}.{validate_sha256(sha256)}.parquet")

    def rollup_window_hour(self, window: str, hour: UtcHour) -> str:
        """Prefix of every rollup object (v3 parts, v2 chunks) of one window of one hour."""
        if window not in ROLLUP_WINDOWS:
            raise KeyLayoutError(f"window must be one of {ROLLUP_WINDOWS}")
        return f"{self.prefix}rollup/v1/window={window}/{hour.partition}/"

    def rollup_index_hour(self, hour: UtcHour) -> str:
        """Prefix of one hour's v2 chunk index objects."""
        return f"{self.prefix}index/v1/{hour.partition}/"

    def rollup_index(self, hour: UtcHour, chunk_id: str) -> str:
        cid = validate_sha256(chunk_id, "chunk_id")
        return f"{self.prefix}index/v1/{hour.partition}/{cid}.lmindex.zst"

    # -- operational markers -----------------------------------------------------------------
    def retention_tombstone(self, scope: str, hour: UtcHour) -> str:
        return f"{self.prefix}retention/v1/{_scope(scope)}/{hour.partition}/tombstone.json"

    def retention_reaped(self, scope: str, hour: UtcHour) -> str:
        return f"{self.prefix}retention/v1/{_scope(scope)}/{hour.partition}/reaped.json"

    def audit_run(self, run_id: str) -> str:
        if not RUN_ID_RE.fullmatch(run_id):
            raise KeyLayoutError("run id must be 1-128 of [A-Za-z0-9_.-]")
        return f"{self.prefix}audit/v1/run={run_id}/"

    def audit_committed(self, committed_at_unix_s: int, run_id: str) -> str:
        """The write-once marker an audit run leaves after its ``summary.json``: keys sort by commit
        time, so the newest committed run is the last key of one listing.

        >>> KeyCodec().audit_committed(1_764_000_000, "r1")
        'audit/v1/committed/001764000000.r1.json'
        """
        if not RUN_ID_RE.fullmatch(run_id):
            raise KeyLayoutError("run id must be 1-128 of [A-Za-z0-9_.-]")
        if not 0 <= committed_at_unix_s < 10**12:
            raise KeyLayoutError("commit time must be in [0, 10^12) seconds")
        return f"{self.audit_committed_root()}{committed_at_unix_s:012d}.{run_id}.json"

    def audit_committed_root(self) -> str:
        return f"{self.prefix}audit/v1/committed/"

    # -- parsing -----------------------------------------------------------------------------
    def parse(self, key: str) -> ParsedKey:
        """Classify ``key`` and extract its fields; raise KeyLayoutError if it is not ours."""
        if not key.startswith(self.prefix):
            raise KeyLayoutError(f"key {key!r} is outside the prefix namespace {self.prefix!r}")
        rel = key[len(self.prefix) :]
        for kind, pattern in _PATTERNS:
            m = pattern.fullmatch(rel)
            if m:
                return _from_match(kind, m)
        raise KeyLayoutError(f"key {key!r} is not in the layout")


def _scope(scope: str) -> str:
    if scope not in RETENTION_SCOPES:
        raise KeyLayoutError(f"retention scope must be one of {RETENTION_SCOPES}")
    return scope


def _from_match(kind: KeyKind, m: re.Match[str]) -> ParsedKey:
    g = m.groupdict()
    identity = None
    try:
        if "agent" in g:
            identity = BatchIdentity.create(
                hex_to_id(g["agent"], "agent"), hex_to_id(g["boot"], "boot"), g["start"], g["end"]
            )
    except InvalidIdentityError as exc:
        raise KeyLayoutError(f"bad identity in key: {exc}") from None
    sha = g.get("sha")
    if sha and g.get("h1") and (sha[0:2] != g["h1"] or sha[2:4] != g["h2"]):
        raise KeyLayoutError("sha256 fan-out directories do not match the hash")
    hour = UtcHour.from_parts(g["date"], g["hour"]) if "date" in g else None
    metric = unquote(g["metric"], errors="strict") if g.get("metric") else None
    if metric is not None and encode_metric(metric) != g["metric"]:
        raise KeyLayoutError("metric segment is not canonically encoded")
    return ParsedKey(
        kind=kind,
        identity=identity,
        sha256=sha,
        hour=hour,
        window=g.get("window"),
        metric=metric,
        chunk_id=g.get("chunk"),
        generation=int(g["gen"]) if g.get("gen") else None,
        scope=g.get("scope"),
        run_id=g.get("run"),
        rest=g.get("rest"),
        part=int(g["part"]) if g.get("part") else None,
    )


def hours_between(first: UtcHour, last: UtcHour) -> list[UtcHour]:
    """Inclusive list of hours from ``first`` to ``last``."""
    out, h = [], first
    while h <= last:
        out.append(h)
        h = h.next()
    return out


__all__ = [
    "KeyCodec",
    "KeyKind",
    "ParsedKey",
    "UtcHour",
    "LAYOUT_ROOTS",
    "PREFIXES",
    "ROLLUP_WINDOWS",
    "encode_metric",
    "hours_between",
    "layout_root",
    "layout_roots",
    "validate_sha256",
]
