"""Keep credentials and obvious secrets out of everything llmtap writes.

Two nets: the exact credentials of the request at hand (its `Authorization`,
`x-api-key`, `x-goog-api-key`, `api-key` headers, its `key=` query parameter and
an injected upstream key), wherever they appear, and patterns that look like
secrets whoever sent them: API keys (`sk-…`, `sk-ant-…`, `AIza…`, …), Bearer
tokens, `key=`-style URL parameters and JSON fields named like `api_key`,
`password`, `token` or `secret`. A given credential is found with whitespace between its
characters too. Used on every text of a request's row (`redact_row`: lists and structs too, so a
key an upstream returns as the model or a tool's name, or a client sends in a path or a tag, is never
stored or logged), on messages, and, with `--capture-bodies`, on captured bodies.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any

from aiohttp.http_exceptions import HttpProcessingError

from proxy.common.schema import REQUEST_COLUMNS

REDACTED = "[REDACTED]"
MIN_SECRET = 8  # shorter credential values are not searched for (they would match ordinary text)

CREDENTIAL_HEADERS = ("authorization", "x-api-key", "x-goog-api-key", "api-key", "proxy-authorization")
CREDENTIAL_PARAMS = ("key", "api_key", "apikey", "access_token", "token")

_KEYS = (
    r"sk-ant-[A-Za-z0-9_\-]{8,}",  # Anthropic
    r"sk-[A-Za-z0-9_\-]{16,}",  # OpenAI (sk-proj-, sk-svcacct-), DeepSeek, OpenRouter (sk-or-v1-), …
    r"AIza[0-9A-Za-z_\-]{30,}",  # Google
    r"AKIA[0-9A-Z]{16}",  # AWS access key id
    r"gh[pousr]_[A-Za-z0-9]{30,}",  # GitHub
    r"xox[abposr]-[A-Za-z0-9\-]{10,}",  # Slack
    r"hf_[A-Za-z0-9]{30,}",  # Hugging Face
    r"eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}",  # a JWT
)
_NAME = r"(?:[A-Za-z0-9]+[_\-.])*(?:api[_\-]?key|password|passwd|secret|token|authorization|credentials?|private[_\-]key|access[_\-]key)"
_NAME_WORDS = ("key", "password", "passwd", "secret", "token", "authorization", "credential")
# (pattern, replacement, lowercase words one of which the text must contain: a cheap test first)
_PATTERNS = [
    (re.compile("|".join(_KEYS)), REDACTED, ("sk-", "aiza", "akia", "gh", "xox", "hf_", "eyj")),
    (re.compile(r"(?i)\b(bearer|basic)(\s+)[A-Za-z0-9._~+/=\-]{8,}"), rf"\1\2{REDACTED}", ("bearer", "basic")),
    (re.compile(r"(?i)\b((?:" + "|".join(CREDENTIAL_HEADERS) + r")['\"]?\s*[:=]\s*['\"]?)[^\s'\",;]+"),
     rf"\1{REDACTED}", CREDENTIAL_HEADERS),
    (re.compile(r"(?i)([?&;](?:" + "|".join(CREDENTIAL_PARAMS) + r")=)[^&;\s\"'<>]+"), rf"\1{REDACTED}",
     tuple(f"{p}=" for p in CREDENTIAL_PARAMS)),
    # "api_key": "…" in JSON,
    (re.compile(r'(?i)("' + _NAME + r'"\s*:\s*")(?:[^"\\]|\\.)+'), rf"\1{REDACTED}", _NAME_WORDS),
    # and in JSON inside a JSON string: \"api_key\": \"…\"
    (re.compile(r'(?i)(\\"' + _NAME + r'\\"\s*:\s*\\")[^"\\]+'), rf"\1{REDACTED}", _NAME_WORDS),
]

_SPACE = re.compile(r"\s")
_ANY_WORD = tuple({w for _, _, words in _PATTERNS for w in words})  # the words any pattern needs


def request_secrets(headers: Mapping[str, str], query: Mapping[str, str] | None = None,
                    extra: Iterable[str | None] = ()) -> list[str]:
    """The credential values a request carries, longest first (each also without its scheme)."""
    found: set[str] = set()
    for name, value in headers.items():
        if name.lower() in CREDENTIAL_HEADERS and value:
            found.add(value.strip())
            found.add(value.strip().partition(" ")[2].strip())
    for name in CREDENTIAL_PARAMS:
        if query and query.get(name):
            found.add(str(query[name]).strip())
    found.update(v.strip() for v in extra if v)
    return sorted((s for s in found if len(s) >= MIN_SECRET), key=len, reverse=True)


def redact(text: str | None, secrets: Iterable[str] = ()) -> str | None:
    """`text` without the given secrets (whitespace between their characters or not) and without
    anything that looks like one."""
    if not text:
        return text
    compact = "".join(text.split()) if _SPACE.search(text) else None  # s k - … : spaces between its characters
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
        if compact is not None and secret in compact:
            text = re.sub(r"\s*".join(map(re.escape, secret)), REDACTED, text)
    low = text.lower()
    if not any(w in low for w in _ANY_WORD):  # the common case: no pattern runs
        return text
    for pattern, replacement, words in _PATTERNS:
        if any(w in low for w in words):
            text = pattern.sub(replacement, text)
    return text


# The row's columns that hold text (VARCHAR, and lists of structs of them), but those llmtap itself
# writes from no outside text.
_OWN = frozenset({"id", "method", "dialect", "outcome", "kind", "tokens_source", "credential_kind", "key_fingerprint"})
TEXT_COLUMNS = tuple(name for name, kind in REQUEST_COLUMNS if "VARCHAR" in kind and name not in _OWN)


def redact_row(row: dict[str, Any], secrets: Iterable[str]) -> None:
    """Every text of a request's row redacted in place, those in its list and struct columns too. The
    texts are looked at together first: most rows hold nothing to redact, and cost one pass."""
    found = list(secrets)
    names = [name for name in TEXT_COLUMNS if row.get(name) is not None]
    together = "\n".join(v if isinstance(v, str) else repr(v) for v in (row[name] for name in names))
    if redact(together, found) == together:
        return
    for name in names:
        row[name] = _redacted(row[name], found)


def _redacted(value: Any, secrets: list[str]) -> Any:
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, list):
        return [_redacted(v, secrets) for v in value]
    if isinstance(value, dict):
        return {k: _redacted(v, secrets) for k, v in value.items()}
    return value


class _ScrubLibraryLogs(logging.Filter):
    """aiohttp logs a request it cannot parse with its raw request line or header line, and a
    library's exception text can hold a URL: either can carry a key. A request that does not
    parse is logged in one line without its bytes; anything else is logged redacted."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.msg, record.args = "llmtap: refused a malformed HTTP request (%s %s)", (exc.code, type(exc).__name__)
            record.exc_info = record.exc_text = None
            return True
        record.msg, record.args = redact(record.getMessage()), ()
        if record.exc_info:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        return True


LIBRARY_LOGGERS = ("aiohttp.server", "aiohttp.web", "aiohttp.access", "aiohttp.client", "aiohttp.internal", "asyncio")


def scrub_library_logs() -> None:
    """Install the filter on the loggers of the libraries that see request bytes (idempotent)."""
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _ScrubLibraryLogs) for f in logger.filters):
            logger.addFilter(_ScrubLibraryLogs())
