"""`llmtap errors`: failures grouped by outcome, status, error type and tool, with a likely cause.

`error_groups` runs one GROUP BY over the `requests` view: the failed
requests. Each group keeps a little evidence (paths, models, key
fingerprints, retry-after values, messages, kinds) for the rules.
`empty_choices_note` counts the successful streams with chunks whose
`choices` list is empty: every Chat Completions stream with
`stream_options.include_usage` ends with one (its usage), so they are not
failures, only worth knowing when a client breaks on them.

`RULES` is a table of small functions. Each looks at one group and returns a
line of likely cause and fix, or None; a group shows the line of every rule
that matches, else a generic line.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from analysis.filters import Filters
from analysis.source import Source

EVIDENCE = 5  # distinct values kept per group and evidence column


@dataclass
class ErrorGroup:
    outcome: str | None
    status: int | None
    error_type: str | None
    count: int
    tool: str | None = None  # the tool that sent these requests (proxy/meter/clients.py's name); None: unknown
    last_seen: str | None = None  # UTC 'YYYY-MM-DD HH:MM'
    paths: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)  # request_model, '(none)' for NULL
    keys: list[str] = field(default_factory=list)  # key_fingerprint, '(none)' for NULL
    retry_after: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    empty_choices_chunks: int = 0
    kinds: list[str] = field(default_factory=list)  # proxy/meter/request_kind.py's, '(none)' for NULL
    methods: list[str] = field(default_factory=list)


def _evidence(column: str) -> str:
    return f"list_slice(list_sort(list(DISTINCT coalesce({column}, '(none)'))), 1, {EVIDENCE})"


GROUPS_SQL = f"""
SELECT outcome, status, error_type, count(*) AS count, tool,
  strftime(max(started_at) AT TIME ZONE 'UTC', '%Y-%m-%d %H:%M') AS last_seen,
  {_evidence('path')} AS paths,
  {_evidence('request_model')} AS models,
  {_evidence('key_fingerprint')} AS keys,
  list_sort(list(DISTINCT retry_after)) AS retry_after,
  list_slice(list_sort(list(DISTINCT error_message)), 1, {EVIDENCE}) AS messages,
  {_evidence('upstream_host')} AS hosts,
  CAST(coalesce(sum(empty_choices_chunks), 0) AS BIGINT) AS empty_choices_chunks,
  {_evidence('kind')} AS kinds,
  {_evidence('method')} AS methods
FROM requests
WHERE ({{where}}) AND error
GROUP BY ALL
ORDER BY count DESC, last_seen DESC, status NULLS LAST, outcome, error_type NULLS LAST, tool NULLS LAST
"""


EMPTY_CHOICES_SQL = """
SELECT count(*) AS requests, CAST(coalesce(sum(empty_choices_chunks), 0) AS BIGINT) AS chunks
FROM requests WHERE ({where}) AND NOT error AND coalesce(empty_choices_chunks, 0) > 0
"""


def empty_choices_note(source: Source, filters: Filters) -> tuple[int, int]:
    """Successful requests that had chunks with empty `choices`, and how many such chunks."""
    _, _, rows = source.query(EMPTY_CHOICES_SQL.format(where=filters.where()))
    requests, chunks = rows[0]
    return int(requests), int(chunks)


def error_groups(source: Source, filters: Filters) -> list[ErrorGroup]:
    columns, _, rows = source.query(GROUPS_SQL.format(where=filters.where()))
    groups = []
    for row in rows:
        values: dict[str, Any] = dict(zip(columns, row))
        for name in ("retry_after", "messages"):
            values[name] = [v for v in values[name] or [] if v is not None]
        groups.append(ErrorGroup(**values))
    return groups


# -- the rules ---------------------------------------------------------------------

_DOUBLED_VERSION = re.compile(r"/(v\d+(?:alpha|beta)?\d*)/\1(?:/|$)")
_ANY_VERSION = re.compile(r"/v\d+(?:alpha|beta)?\d*(?:/|$)")
_MODEL = re.compile(r"\bmodel", re.IGNORECASE)


def _listed(values: list[str]) -> str:
    return ", ".join(values)


def auth(g: ErrorGroup) -> str | None:
    """401/403: which key, and what is usually wrong with it."""
    keys = f"keys seen: {_listed(g.keys)}" + (" ((none): no key sent)" if "(none)" in g.keys else "")
    if g.status == 401:
        return (f"API key rejected: missing, expired or revoked, or with stray whitespace or a"
                f" newline; {keys}")
    if g.status == 403:
        return (f"the key works but may not do this (no access to the model, organisation,"
                f" project or region); {keys}")
    return None


def doubled_version(g: ErrorGroup) -> str | None:
    """404 on /v1/v1/...: the base URL already ends in /v1 and the client adds another."""
    doubled = [p for p in g.paths if _DOUBLED_VERSION.search(p)]
    if g.status != 404 or not doubled:
        return None
    segment = _DOUBLED_VERSION.search(doubled[0]).group(1)  # type: ignore[union-attr]
    return (f"path {_listed(doubled)} repeats /{segment}: the base URL already ends in"
            f" /{segment} and the client adds another: remove /{segment} from the base URL")


def missing_version(g: ErrorGroup) -> str | None:
    """404 on a path with no version segment: an OpenAI-style base URL without /v1."""
    bare = [p for p in g.paths if p != "(none)" and not _ANY_VERSION.search(p)]
    if g.status != 404 or not bare:
        return None
    return (f"path {_listed(bare)} has no /v1: OpenAI-style clients append only"
            f" /chat/completions or /responses, so their base URL must end in /v1")


def unknown_model(g: ErrorGroup) -> str | None:
    """404 whose message mentions the model: a misspelt or inaccessible model id."""
    if g.status != 404 or not any(_MODEL.search(m) for m in g.messages):
        return None
    return (f"unknown model {_listed(g.models)}: check the model id for typos, and that the"
            f" key may use it")


def rate_limited(g: ErrorGroup) -> str | None:
    if g.status != 429:
        return None
    delays = [f"{v} s" if v.isdigit() else v for v in g.retry_after]
    waits = f" (retry-after: {_listed(delays)})" if delays else ""
    return f"rate limited{waits}: lower the request rate or concurrency, or raise the quota"


def upstream_failing(g: ErrorGroup) -> str | None:
    """5xx and 529 answered by the upstream (llmtap's own 502/504 have other outcomes)."""
    if g.outcome != "http_error" or g.status is None or g.status < 500:
        return None
    what = "overloaded" if g.status in (503, 529) else "failing"
    return (f"upstream {what} (HTTP {g.status}): retry later with backoff; check the provider's"
            f" status page")


def stream_error(g: ErrorGroup) -> str | None:
    """An error event inside a 200 stream (e.g. Anthropic's overloaded_error)."""
    if g.outcome != "stream_error":
        return None
    overloaded = "overloaded" in (g.error_type or "").lower()
    fix = "the upstream is overloaded: retry later" if overloaded else "retry, and check the message"
    return f"the upstream sent an error event mid-stream ({g.error_type}): the answer is cut short; {fix}"


def no_route(g: ErrorGroup) -> str | None:
    """llmtap's own 404: the path matches no configured route prefix."""
    if g.error_type != "no_route":
        return None
    return (f"llmtap has no route for {_listed(g.paths)}: fix the client's base URL, or add"
            f" `llmtap serve --route PREFIX=URL`")


def forward_proxy(g: ErrorGroup) -> str | None:
    """CONNECT: a client was told to use llmtap as its HTTP(S)_PROXY."""
    if g.error_type != "method_not_allowed":
        return None
    return ("a client used llmtap as a forward proxy (HTTPS_PROXY points at it): set the tool's"
            " base URL to llmtap instead")


def too_large(g: ErrorGroup) -> str | None:
    if g.error_type != "request_too_large":
        return None
    return "request bodies over llmtap's limit: raise `llmtap serve --max-body-mb`"


def unreachable(g: ErrorGroup) -> str | None:
    if g.outcome != "upstream_unreachable":
        return None
    return (f"could not connect to {_listed(g.hosts)} (DNS failure or connection refused):"
            f" check the route's upstream URL, and HTTP_PROXY/HTTPS_PROXY/NO_PROXY")


def timed_out(g: ErrorGroup) -> str | None:
    if g.outcome != "upstream_timeout":
        return None
    return ("the upstream was silent longer than llmtap's timeout (overloaded?): retry, or"
            " raise `llmtap serve --connect-timeout/--idle-timeout`")


def client_disconnected(g: ErrorGroup) -> str | None:
    if g.outcome != "client_disconnected":
        return None
    return ("the client gave up before the end (its own timeout, or Ctrl-C): not an upstream"
            " failure")


def stream_truncated(g: ErrorGroup) -> str | None:
    if g.outcome != "stream_truncated":
        return None
    return ("the upstream closed the stream before its terminal event (network drop or"
            " upstream crash): the client got a partial answer")


def proxy_error(g: ErrorGroup) -> str | None:
    if g.outcome != "proxy_error":
        return None
    return "llmtap itself failed on these requests: see the `llmtap serve` log, and report a bug"


def empty_choices(g: ErrorGroup) -> str | None:
    """A failed stream that carried chunks with empty `choices`: perhaps the client broke on one."""
    if g.empty_choices_chunks <= 0:
        return None
    return (f"{g.empty_choices_chunks} chunks with empty `choices` (usage or content-filter"
            f" chunks) break clients that read choices[0] unchecked ('reading choices' errors)")


def probe(g: ErrorGroup) -> str | None:
    """Failed probes (HEAD, OPTIONS, GET /), worded by the group's methods and tool: Claude Code's
    `HEAD /` before each prompt is a warm-up it ignores; another's `GET /` asked for a page."""
    if g.kinds != ["probe"]:
        return None
    asked = f"{'/'.join(g.methods) or 'probe'} {_listed(g.paths)}"
    if g.tool == "claude-code" and set(g.methods) <= {"HEAD", "OPTIONS"}:
        return f"these are warm-up probes ({asked}, as Claude Code sends before each prompt): it ignores the answer, so they are harmless"
    sender = g.tool or "an unnamed client"
    return (f"{asked} from {sender}: a probe, not a model call (the upstream has no page there);"
            " harmless unless that client expects an answer")


Rule = Callable[[ErrorGroup], "str | None"]
RULES: tuple[tuple[str, Rule], ...] = (
    ("auth", auth),
    ("doubled_version", doubled_version),
    ("missing_version", missing_version),
    ("unknown_model", unknown_model),
    ("rate_limited", rate_limited),
    ("upstream_failing", upstream_failing),
    ("stream_error", stream_error),
    ("no_route", no_route),
    ("forward_proxy", forward_proxy),
    ("too_large", too_large),
    ("unreachable", unreachable),
    ("timed_out", timed_out),
    ("client_disconnected", client_disconnected),
    ("stream_truncated", stream_truncated),
    ("proxy_error", proxy_error),
    ("empty_choices", empty_choices),
    ("probe", probe),
)


def generic(g: ErrorGroup) -> str:
    said = f": {g.messages[0]}" if g.messages else ""
    if g.status == 404:
        return f"the upstream has no such endpoint{said}: check the client's base URL and the path"
    return f"no known cause{said}"


def diagnose(g: ErrorGroup) -> list[str]:
    """The likely causes and fixes for one group (at least one line); a probe's is the only one."""
    if (line := probe(g)) is not None:
        return [line]
    lines = [line for _, rule in RULES if (line := rule(g)) is not None]
    return lines or [generic(g)]
