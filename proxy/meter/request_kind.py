"""What a request is: a generation, or one of the calls tools make around them.

Decided once, when the row is built, from the method, the path (its end: routes
may put any prefix before it), the request body, and for Responses over
WebSocket the `response.create` frame that started the response. Codex also
says it in its `x-codex-turn-metadata` header (JSON, `"request_kind": "turn"`).

- `generation`: Chat Completions, Responses, Messages, Gemini generateContent;
  streamed or not, over HTTP or WebSocket.
- `token_count`: Anthropic `/messages/count_tokens` (Claude Code sends dozens),
  Responses `/responses/input_tokens`, Gemini `:countTokens`.
- `embedding`: `/embeddings`, Gemini `:embedContent`, `:batchEmbedContents`.
- `model_list`: `GET …/models` and `GET …/models/{id}`.
- `probe`: `HEAD` or `OPTIONS` anything (Claude Code's `HEAD /` warm-up), `GET /`.
- `prewarm`: a WebSocket `response.create` with `"generate": false` (Codex warms
  the connection before the turn; the answer carries no output).
- `side`: a generation an agent makes beside its turns, to itself rather than for the person: one that
  declares no tools from an agent whose turns always do (Claude Code's and opencode's title requests, Qwen
  Code's and Gemini CLI's summaries and checks), or Gemini's `responseMimeType: application/json` (Gemini CLI's
  next-speaker and routing checks). Only for those agents (`SIDE_AGENTS`): aider declares no tools at
  all, an SDK script's tool-less call is its own work. Not a turn: sessions leave it out; the GenAI
  metrics, OpenTelemetry and the costs of `llmtap run` and the live feed count it with the generations.
- `other`: everything else (Codex's `/responses/compact`, retrieving a stored
  response, a refused WebSocket upgrade, unknown paths).

Only generations are what latency percentiles describe: the others take a few
milliseconds (or a different path through the upstream) and would pull them down.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import orjson

from proxy.common.schema import KINDS

__all__ = ["GENERATION", "KINDS", "SIDE", "path_kind", "path_kind_sql", "request_kind", "side_request"]

GENERATION = "generation"
SIDE = "side"
# agents whose every turn declares tools (real-clis.md), so a generation without any is a side request
SIDE_AGENTS = frozenset({"claude-code", "gemini-cli", "opencode", "qwen-code"})

_TOKEN_COUNT = ("/messages/count_tokens", "/responses/input_tokens", ":counttokens")
_EMBEDDING = ("/embeddings", ":embedcontent", ":batchembedcontents")
_GENERATION = ("/chat/completions", "/completions", "/messages", "/responses", ":generatecontent",
               ":streamgeneratecontent")
_CODEX_KINDS = {"turn": GENERATION, "prewarm": "prewarm"}


@functools.lru_cache(maxsize=1024)  # a client uses a handful of paths
def path_kind(method: str, path: str) -> str:
    """The kind the method and path alone say (no body): what `analysis.views` also derives in SQL
    for rows recorded before the `kind` column."""
    method = method.upper()
    if method in ("HEAD", "OPTIONS"):
        return "probe"
    p = path.split("?", 1)[0].replace("%3A", ":").replace("%3a", ":").rstrip("/").lower()
    if p.endswith(_TOKEN_COUNT):
        return "token_count"
    if p.endswith(_EMBEDDING):
        return "embedding"
    if method == "GET":
        last, _, rest = p.rpartition("/")
        if p.endswith("/models") or (rest and ":" not in rest and last.endswith("/models")):
            return "model_list"
        return "probe" if p == "" else "other"
    if method == "POST" and p.endswith(_GENERATION):
        return GENERATION
    return "other"


def request_kind(method: str, path: str, get: Callable[..., Any], body: Any) -> str:
    """The request's kind; `get` reads its headers, `body` is the parsed JSON body (or None).

    A WebSocket turn comes as `GET …/responses` with the `response.create` frame as its body."""
    if isinstance(body, dict) and body.get("type") == "response.create":
        nested = body.get("response")
        generate = nested.get("generate") if isinstance(nested, dict) and "generate" in nested else body.get("generate")
        return "prewarm" if generate is False else GENERATION
    kind = path_kind(method, path)
    if kind in ("other", GENERATION):
        said = _codex_kind(get("x-codex-turn-metadata"))
        if said is not None and method.upper() == "POST":
            return said
    return kind


def side_request(tool: str | None, body: Any) -> bool:
    """A generation an agent sends beside its turns (module docstring: `side`)."""
    if tool not in SIDE_AGENTS or not isinstance(body, dict):
        return False
    if not body.get("tools"):
        return True
    config = body.get("generationConfig")
    return isinstance(config, dict) and config.get("responseMimeType") == "application/json"


def _codex_kind(metadata: str | None) -> str | None:
    if not metadata or "request_kind" not in metadata:
        return None
    try:
        value = orjson.loads(metadata)
    except orjson.JSONDecodeError:
        return None
    said = value.get("request_kind") if isinstance(value, dict) else None
    return _CODEX_KINDS.get(said) if isinstance(said, str) else None


def path_kind_sql(method: str = "method", path: str = "path", status: str = "status") -> str:
    """`path_kind` as a DuckDB expression over these columns; a `GET …/responses` answered 101 (a
    WebSocket response, whose frame the row does not keep) counts as a generation."""
    p = f"lower(rtrim(replace(replace(split_part({path}, '?', 1), '%3A', ':'), '%3a', ':'), '/'))"
    m = f"upper({method})"

    def ends(suffixes: tuple[str, ...]) -> str:
        return "(" + " OR ".join(f"ends_with({p}, '{s}')" for s in suffixes) + ")"

    return (
        f"CASE WHEN {m} IN ('HEAD', 'OPTIONS') THEN 'probe'"
        f" WHEN {ends(_TOKEN_COUNT)} THEN 'token_count'"
        f" WHEN {ends(_EMBEDDING)} THEN 'embedding'"
        f" WHEN {m} = 'GET' AND (ends_with({p}, '/models') OR regexp_matches({p}, '/models/[^/:]+$'))"
        " THEN 'model_list'"
        f" WHEN {m} = 'GET' AND {p} = '' THEN 'probe'"
        f" WHEN {m} = 'GET' AND {status} = 101 AND ends_with({p}, '/responses') THEN 'generation'"
        f" WHEN {m} = 'POST' AND {ends(_GENERATION)} THEN 'generation'"
        " ELSE 'other' END"
    )
