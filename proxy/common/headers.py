"""End-to-end header filtering (RFC 9110 §7.6.1): drop hop-by-hop, keep the rest."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from multidict import CIMultiDict, CIMultiDictProxy

HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate",
        "Proxy-Authorization", "TE", "Trailer", "Transfer-Encoding", "Upgrade",
    )
)

# Consumed by llmtap itself, never forwarded.
TAG_HEADER = "x-llmtap-tag"
REQUEST_DROP = HOP_BY_HOP | {"host", "content-length", TAG_HEADER}
RESPONSE_DROP = HOP_BY_HOP


def header_getter(headers: Mapping[str, str]) -> Callable[..., Any]:
    """A case-insensitive `get` for any headers mapping: aiohttp's own is used as is
    (the hot path), a plain dict is lowered once."""
    if isinstance(headers, (CIMultiDict, CIMultiDictProxy)):
        return headers.get
    return {k.lower(): v for k, v in headers.items()}.get


def _named_by_connection(headers: CIMultiDictProxy[str]) -> set[str]:
    names: set[str] = set()
    for value in headers.getall("Connection", ()):
        names.update(token.strip().lower() for token in value.split(",") if token.strip())
    return names


def end_to_end(headers: CIMultiDictProxy[str], drop: frozenset[str] | set[str]) -> CIMultiDict[str]:
    """A copy of `headers` without `drop` and without the headers Connection names."""
    extra = _named_by_connection(headers) if "Connection" in headers else ()
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        low = name.lower()
        if low in drop or low in extra:
            continue
        out.add(name, value)
    return out


def request_headers(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    return end_to_end(headers, REQUEST_DROP)


CREDENTIAL_HEADERS = ("authorization", "x-api-key", "x-goog-api-key")


def inject_credential(headers: CIMultiDict[str], api: str, key: str) -> None:
    """Replace whatever credential the client sent with `key`, in the header `api` expects."""
    for name in CREDENTIAL_HEADERS:
        headers.popall(name, None)
    if api == "anthropic":
        headers["x-api-key"] = key
    elif api == "gemini":
        headers["x-goog-api-key"] = key
    else:
        headers["Authorization"] = f"Bearer {key}"


def response_headers(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    return end_to_end(headers, RESPONSE_DROP)
