"""Batch identities: ``(agent_id, boot_id, seq_start, seq_end)`` and their key encoding.

Pure functions, no I/O. An identity that passes :func:`BatchIdentity.create` can always be
turned into object keys; nothing else can, so a bad id is a 400, never a strange key.

Example:
    >>> ident = BatchIdentity.create("agent-a", "boot-1", 10, 20)
    >>> ident.agent_hex
    '6167656e742d61'
    >>> ident.seq_range
    '00000000000000000010-00000000000000000020'
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote, unquote_to_bytes

from lightmetrics.protocol.errors import InvalidIdentityError

MAX_ID_BYTES = 128
MAX_SEQ = 2**64 - 1
SEQ_WIDTH = 20  # digits of 2**64 - 1, so lexicographic order is numeric order


def validate_id(value: object, field: str) -> str:
    """Return ``value`` if it is a valid agent/boot id, else raise InvalidIdentityError."""
    if not isinstance(value, str):
        raise InvalidIdentityError(f"{field} must be a string")
    try:
        raw = value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidIdentityError(f"{field} is not valid UTF-8") from None
    if not 1 <= len(raw) <= MAX_ID_BYTES:
        raise InvalidIdentityError(f"{field} must be 1-{MAX_ID_BYTES} bytes of UTF-8, got {len(raw)}")
    for ch in value:
        code = ord(ch)
        if code < 0x20 or 0x7F <= code <= 0x9F:
            raise InvalidIdentityError(f"{field} contains a control character (U+{code:04X})")
        if ch == "/":
            raise InvalidIdentityError(f"{field} must not contain '/'")
    return value


#: An id header in RFC 8187's ext-value form carries UTF-8, percent-encoded (docs/protocol.md §7).
UTF8_ID_PREFIX = "UTF-8''"
_PRINTABLE_ASCII = {chr(c) for c in range(0x20, 0x7F)}


def id_header_value(value: str) -> str:
    """How an agent or boot id travels in ``X-Lm-Agent-Id`` / ``X-Lm-Boot-Id`` (protocol §7):
    itself if it is printable ASCII (and does not begin like the encoded form), else
    ``UTF-8''`` + its UTF-8 bytes percent-encoded (RFC 8187), which header values — ISO-8859-1 on
    the wire — carry unchanged.

    >>> id_header_value("agent-1"), id_header_value("agent-é")
    ('agent-1', "UTF-8''agent-%C3%A9")
    """
    if set(value) <= _PRINTABLE_ASCII and not value.upper().startswith(UTF8_ID_PREFIX.upper()):
        return value
    return UTF8_ID_PREFIX + quote(value.encode("utf-8"), safe="-._~")


def id_from_header(value: str | None, name: str) -> str | None:
    """The id an ``X-Lm-*-Id`` header carries (:func:`id_header_value` read back); an id header
    with anything but printable ASCII, or a bad encoding, is :class:`InvalidIdentityError`.

    >>> id_from_header("UTF-8''agent-%C3%A9", "agent_id")
    'agent-é'
    """
    if value is None:
        return None
    if not set(value) <= _PRINTABLE_ASCII:
        raise InvalidIdentityError(f"{name} header is not printable ASCII: send a non-ASCII id as "
                                   f"{UTF8_ID_PREFIX}<its UTF-8 bytes percent-encoded> (RFC 8187)")
    if not value.upper().startswith(UTF8_ID_PREFIX.upper()):
        return value
    try:
        return unquote_to_bytes(value[len(UTF8_ID_PREFIX):]).decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidIdentityError(f"{name} header: its percent-encoded bytes are not UTF-8") from None


def validate_seq(value: object, field: str) -> int:
    """Return ``value`` as an int in [0, 2**64) or raise InvalidIdentityError."""
    if isinstance(value, bool):
        raise InvalidIdentityError(f"{field} must be an integer")
    if isinstance(value, str):
        if not value.isascii() or not value.isdigit() or len(value) > SEQ_WIDTH:
            raise InvalidIdentityError(f"{field} must be a decimal integer in [0, 2^64), got {value!r}")
        value = int(value)
    if not isinstance(value, int):
        raise InvalidIdentityError(f"{field} must be an integer")
    if not 0 <= value <= MAX_SEQ:
        raise InvalidIdentityError(f"{field} must be in [0, 2^64), got {value}")
    return value


def id_to_hex(value: str) -> str:
    """Lowercase hex of the UTF-8 bytes: the key and spool-file encoding of an id."""
    return value.encode("utf-8").hex()


def hex_to_id(value: str, field: str = "id") -> str:
    """Inverse of :func:`id_to_hex`; validates the decoded id."""
    if not value or len(value) % 2 or value != value.lower():
        raise InvalidIdentityError(f"{field} hex must be non-empty lowercase hex of even length")
    try:
        decoded = bytes.fromhex(value).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        raise InvalidIdentityError(f"{field} hex does not decode to UTF-8") from None
    return validate_id(decoded, field)


def format_seq(value: int) -> str:
    return f"{value:0{SEQ_WIDTH}d}"


@dataclass(frozen=True, slots=True)
class BatchIdentity:
    """The identity of one batch; construct with :meth:`create` to validate."""

    agent_id: str
    boot_id: str
    seq_start: int
    seq_end: int

    @classmethod
    def create(cls, agent_id: object, boot_id: object, seq_start: object, seq_end: object) -> "BatchIdentity":
        agent = validate_id(agent_id, "agent_id")
        boot = validate_id(boot_id, "boot_id")
        start = validate_seq(seq_start, "seq_start")
        end = validate_seq(seq_end, "seq_end")
        if start > end:
            raise InvalidIdentityError(f"seq_start ({start}) must be <= seq_end ({end})")
        return cls(agent, boot, start, end)

    @property
    def agent_hex(self) -> str:
        return id_to_hex(self.agent_id)

    @property
    def boot_hex(self) -> str:
        return id_to_hex(self.boot_id)

    @property
    def seq_range(self) -> str:
        return f"{format_seq(self.seq_start)}-{format_seq(self.seq_end)}"

    @property
    def manifest_id(self) -> str:
        """``<agent-hex>.<boot-hex>.<seq-start>-<seq-end>`` (docs/protocol.md §2)."""
        return f"{self.agent_hex}.{self.boot_hex}.{self.seq_range}"

    @property
    def spool_name(self) -> str:
        """File name of this batch in an agent's spool (same encoding as the keys)."""
        return f"agent={self.agent_hex}.boot={self.boot_hex}.{self.seq_range}.lmframe"

    def __str__(self) -> str:
        return f"{self.agent_id}/{self.boot_id}/{self.seq_start}-{self.seq_end}"
