"""Tell API keys apart without storing them, and keep them out of logs."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from proxy.common.headers import header_getter

def key_fingerprint(
    headers: Mapping[str, str], query: Mapping[str, str] | None = None
) -> str | None:
    """`"k:"` + the first 12 hex digits of the credential's SHA-256.

    The credential is the first of: `Authorization` (without its `Bearer `),
    `x-api-key`, `x-goog-api-key`, the `key` query parameter.

    Why 12 hex digits (48 bits): one machine sees a handful of keys, and the
    chance that two of n keys share a fingerprint is about n²/2**49, about
    1 in 10**12 for 20 keys. Yet API keys carry well over 100 bits of
    randomness: each fingerprint is shared by some 2**(bits - 48) possible
    keys, so it cannot be turned back into the key, and a match only confirms
    a key that an attacker already holds.
    """
    secret = _credential(headers, query)
    return secret_fingerprint(secret) if secret else None


def credential_kind(headers: Mapping[str, str], query: Mapping[str, str] | None = None) -> str | None:
    """What kind of credential the client sent, from its form (the credential itself is never kept):

    - `claude_login`: Claude Code on a Claude subscription (`Bearer sk-ant-oat…`, or an OAuth
      `anthropic-beta`);
    - `chatgpt_login`: Codex on a ChatGPT login (a `Bearer` JWT with `chatgpt-account-id`);
    - `api_key`: an API key (`x-api-key`, `x-goog-api-key`, `?key=`, or a `Bearer sk-…`);
    - `bearer`: another bearer token; None: no credential.
    """
    get = header_getter(headers)
    auth = get("authorization", "").strip()
    if auth:
        scheme, _, token = auth.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return "bearer"
        if token.startswith("sk-ant-oat") or "oauth-" in get("anthropic-beta", ""):
            return "claude_login"
        if token.startswith("eyJ") and token.count(".") == 2 and get("chatgpt-account-id", ""):
            return "chatgpt_login"
        return "api_key" if token.startswith("sk-") else "bearer"
    if get("x-api-key", "").strip() or get("x-goog-api-key", "").strip() or (query or {}).get("key"):
        return "api_key"
    return None


def secret_fingerprint(secret: str) -> str:
    return "k:" + hashlib.sha256(secret.encode("utf-8", "surrogateescape")).hexdigest()[:12]


def _credential(headers: Mapping[str, str], query: Mapping[str, str] | None) -> str | None:
    get = header_getter(headers)
    auth = get("authorization", "").strip()
    if auth:
        scheme, _, rest = auth.partition(" ")
        return rest.strip() if scheme.lower() == "bearer" and rest.strip() else auth
    for name in ("x-api-key", "x-goog-api-key"):
        value = get(name, "").strip()
        if value:
            return value
    return (query or {}).get("key") or None
