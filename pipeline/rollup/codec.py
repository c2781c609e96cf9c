"""What every rollup object's bytes share: zstd framing, the schema check, and the format error.

The chunk (:mod:`lightmetrics_pipeline.rollup.chunks`), the sketch (:mod:`lightmetrics_pipeline.rollup.sketch`), the
chunk lists and the manifest (:mod:`lightmetrics_pipeline.rollup.manifest`) all refuse bad bytes with
:class:`ChunkFormatError`, and a newer schema with the core's ``UnsupportedVersionError`` (docs/protocol.md §17).
"""

from __future__ import annotations

import zstandard

from lightmetrics.protocol.errors import ManifestError, UnsupportedVersionError
from lightmetrics.protocol.manifests import check_schema

ZSTD_LEVEL = 3


class ChunkFormatError(ValueError):
    """Bytes that are not a valid rollup object."""


def zstd_compress(data: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True, write_checksum=False,
                                    write_dict_id=False).compress(data)


def zstd_decompress(data: bytes, what: str) -> bytes:
    try:
        return zstandard.ZstdDecompressor().decompress(data, max_output_size=256 * 1024 * 1024)
    except zstandard.ZstdError as exc:
        raise ChunkFormatError(f"{what}: not a zstd frame: {exc}") from None


def check_object_schema(stored: object, known: str, what: str) -> None:
    """A newer schema version is refused with the core's UnsupportedVersionError (protocol §17);
    any other mismatch is a ChunkFormatError."""
    try:
        check_schema(stored, known, what)
    except UnsupportedVersionError:
        raise
    except ManifestError as exc:
        raise ChunkFormatError(str(exc)) from None


__all__ = ["ChunkFormatError", "ZSTD_LEVEL", "check_object_schema", "zstd_compress", "zstd_decompress"]
