"""Streaming decompression of the measuring copy, never of the relayed bytes.

The client receives the upstream's compressed bytes untouched; the meter needs
text. Output is bounded so that a body which expands enormously (a
decompression bomb) costs a metric, not memory.
"""

from __future__ import annotations

import zlib
from typing import Protocol

try:  # Python 3.14+
    from compression import zstd as _zstd  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - depends on the Python version
    try:
        from backports import zstd as _zstd  # type: ignore[no-redef]
    except ImportError:
        _zstd = None

try:
    import brotli as _brotli
except ImportError:  # pragma: no cover
    _brotli = None

DEFAULT_LIMIT = 64 * 1024 * 1024


class DecodeError(Exception):
    pass


class _Codec(Protocol):
    def decompress(self, data: bytes, max_length: int) -> bytes: ...


class _Zlib:
    def __init__(self, wbits: int) -> None:
        self._d = zlib.decompressobj(wbits)

    def decompress(self, data: bytes, max_length: int) -> bytes:
        return self._d.decompress(data, max_length)


class _Brotli:
    def __init__(self) -> None:
        if _brotli is None:
            raise DecodeError("brotli is not installed")
        self._d = _brotli.Decompressor()

    def decompress(self, data: bytes, max_length: int) -> bytes:
        out = self._d.process(data)
        return out[:max_length]


class _Zstd:
    def __init__(self) -> None:
        if _zstd is None:
            raise DecodeError("zstd support is not installed")
        self._d = _zstd.ZstdDecompressor()

    def decompress(self, data: bytes, max_length: int) -> bytes:
        out = self._d.decompress(data, max_length)
        if self._d.eof and self._d.unused_data:  # concatenated frames
            rest = self._d.unused_data
            self._d = _zstd.ZstdDecompressor()
            out += self.decompress(rest, max_length - len(out))
        return out


def _codec(encoding: str) -> _Codec | None:
    if encoding in ("", "identity"):
        return None
    if encoding in ("gzip", "x-gzip"):
        return _Zlib(47)  # gzip or zlib header, auto-detected
    if encoding == "deflate":
        return _Zlib(15)
    if encoding == "br":
        return _Brotli()
    if encoding == "zstd":
        return _Zstd()
    raise DecodeError(f"unsupported content-encoding {encoding!r}")


class StreamDecoder:
    """Feeds compressed chunks, returns decompressed ones, up to `limit` bytes in all."""

    def __init__(self, content_encoding: str | None, limit: int = DEFAULT_LIMIT) -> None:
        codings = [c.strip().lower() for c in (content_encoding or "").split(",") if c.strip()]
        self._codecs = [c for c in (_codec(e) for e in reversed(codings)) if c is not None]
        self._left = limit
        self.exhausted = False

    @property
    def identity(self) -> bool:
        return not self._codecs

    def feed(self, data: bytes) -> bytes:
        if self.exhausted:
            return b""
        for codec in self._codecs:
            data = codec.decompress(data, self._left + 1)
        if len(data) > self._left:
            data = data[: self._left]
            self.exhausted = True
        self._left -= len(data)
        return data


def decode_all(body: bytes, content_encoding: str | None, limit: int = DEFAULT_LIMIT) -> bytes:
    """The whole of a compressed body, bounded; raises DecodeError on bad input."""
    try:
        decoder = StreamDecoder(content_encoding, limit)
        return decoder.feed(body)
    except DecodeError:
        raise
    except Exception as exc:  # zlib.error, brotli.error, ZstdError
        raise DecodeError(f"cannot decode {content_encoding} body: {exc}") from None
