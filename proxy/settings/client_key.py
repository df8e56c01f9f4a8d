"""llmtap's own client key: what a client presents where a route injects the upstream key.

A route with `--route-key-env` (or `--upstream-key-env`) spends a real key on the client's
behalf, so the proxy must know the client may: another Unix user on the machine, or a web page
in the user's browser, can reach 127.0.0.1 too. The client key is made once, kept owner-only in
the data directory (`paths.client_key_path()`), and written into each tool's configuration by
`llmtap setup`; a request on such a route without it gets a 401 in the API's shape and never
reaches the upstream. It is a credential like any other: never stored, logged, echoed or sent
on: where it was accepted (a credential header, or Gemini's `?key=`), the upstream gets the real
key in its place (`headers.inject_credential`, `without_key`).
"""

from __future__ import annotations

import hmac
import os
import secrets
import urllib.parse
from collections.abc import Mapping
from pathlib import Path

from proxy.common import paths

PREFIX = "sk-llmtap-"


class SecretFileError(Exception):
    """A secret file that cannot be used; the message says why (never its content)."""


def read_secret_file(path: Path) -> str:
    """The secret in `path`, stripped; refused when other users may read it."""
    try:
        st = path.stat()
        text = path.read_text().strip()
    except OSError as exc:
        raise SecretFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    if st.st_mode & 0o077:
        raise SecretFileError(f"{path} is readable by other users: chmod 600 {path}")
    if not text:
        raise SecretFileError(f"{path} is empty")
    return text


def client_key(path: Path | None = None, prefix: str = PREFIX) -> str:
    """The client key, made on first use (owner-only, in an owner-only directory)."""
    path = path or paths.client_key_path()
    try:
        return read_secret_file(path)
    except SecretFileError:
        if path.exists():
            raise
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = prefix + secrets.token_hex(24)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it meanwhile
        return read_secret_file(path)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    return key


def telemetry_token() -> str:
    """What the agents' OpenTelemetry exports present to llmtap (proxy/relay/otlp.py), made and kept as
    the client key is; `llmtap setup` writes it into each tool's telemetry settings."""
    return client_key(paths.telemetry_token_path(), "llmtap-otlp-")


def presented(headers: Mapping[str, str], query: Mapping[str, str]) -> list[str]:
    """Every credential the client sent, where the APIs take one."""
    found: list[str] = []
    value: str | None
    auth = headers.get("Authorization")
    if auth:
        scheme, _, value = auth.partition(" ")
        found.append(value.strip() if scheme.lower() == "bearer" else auth)
    for name in ("x-api-key", "x-goog-api-key"):
        if value := headers.get(name):
            found.append(value.strip())
    if value := query.get("key"):
        found.append(value)
    return found


def accepts(expected: str, headers: Mapping[str, str], query: Mapping[str, str]) -> bool:
    """Whether the client presented the client key (in constant time per candidate)."""
    return any(same_secret(v, expected) for v in presented(headers, query))


def same_secret(sent: str, expected: str) -> bool:
    """Whether the secret a request carried is `expected`: their bytes compared in constant time.
    Bytes of a header that are not UTF-8 arrive as lone surrogates (aiohttp decodes with
    `surrogateescape`); `surrogatepass` encodes every string, so such a value is just unequal."""
    return bool(expected) and hmac.compare_digest(sent.encode("utf-8", "surrogatepass"),
                                                  expected.encode("utf-8", "surrogatepass"))


def without_key(query_string: str) -> str:
    """The raw query string without its `key` parameters, every other byte as sent: on a route that
    injects the upstream key, the client's key (llmtap's client key, accepted as Gemini's `?key=`)
    is not sent on beside the injected one, as `inject_credential` drops the client's headers."""
    if "key" not in query_string and "%" not in query_string:  # the common case, without splitting
        return query_string
    kept = [part for part in query_string.split("&")
            if urllib.parse.unquote_plus(part.partition("=")[0]) != "key"]
    return "&".join(kept)
