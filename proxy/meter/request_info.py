"""What a request asked for: model, streaming, limits, size, session, project, and what it is (its kind).

Read from a copy of the request body (decoded if the client compressed it:
Codex sends zstd bodies) and never raising: a body that should be JSON and is
not is recorded in `request_parse_error` and forwarded untouched all the same.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.meter.decode import decode_all
from proxy.meter.dialects.base import Dialect
from proxy.meter.dialects.detect import detect_dialect
from proxy.meter.dialects.gemini import Gemini
from proxy.common.headers import header_getter
from proxy.meter.clients import Client, client_of
from proxy.meter.conversations import INFERRED_FOR
from proxy.meter.request_kind import GENERATION, SIDE, request_kind, side_request

MAX_DECODED_BYTES = 64 * 1024 * 1024
SESSION_HEADERS = ("x-claude-code-session-id", "session-id", "session_id", "x-session-id")

_GEMINI_MODEL = re.compile(r"/models/([^/:?]+):")
_OLD_CLAUDE_SESSION = re.compile(r"_session_([0-9a-fA-F-]{36})$")
_BODYLESS_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "DELETE"})

# The project: the last component of the working directory the tool says it works in, where it says
# so itself and nowhere a file's text can be (docs/columns.md `project`):
# - Claude Code: its system prompt's `<env>` block, `Working directory: /p` (`Primary working directory:`);
# - Codex: the `<environment_context>` message it puts first in `input`, `<cwd>/p</cwd>`;
# - Cline: its system prompt's `<env>` block, `4. Working Directory: /p`;
# - opencode: its system prompt's `<env>` block, `Working directory: /p`;
# - Gemini CLI: the `<session_context>` block it opens `contents` with, `- **Workspace Directories:**`
#   then `  - /p` (the first one);
# - Qwen Code: the `<system-reminder>` block of its first user message, `I'm currently working in the
#   directory: /p`.
# Only the system prompt (Anthropic `system`, `system`/`developer` messages of Chat Completions and
# Responses, Responses `instructions`) and the CLIs' own blocks (a text that opens with their tag) are
# read: never what a person typed, tool results or files.
# `…orking directory:` / `…orking Directory:` found with str.find (a regex over a 20 KB system prompt
# costs ~1 ms, str.find ~microseconds), then the value read after it
_CWD_NEEDLES = ("orking directory:", "orking Directory:")
_CWD_VALUE = re.compile(r"[ \t]*([^\r\n]{1,4096})")
_CODEX_CWD = re.compile(r"<cwd>([^<\r\n]{1,4096})</cwd>")
_CONTEXT_CWD = re.compile(r"(?:\*\*Workspace Directories:\*\*\s*-|working in the directory:)[ \t]*([^\r\n]{1,4096})")
_CONTEXT_TAGS = ("<session_context>", "<system-reminder>")  # Gemini CLI's, Qwen Code's
PROJECT_MAX = 200  # characters of the component kept
_SCAN_ITEMS = 8  # system blocks / messages / input items looked at, from the start
_SCAN_CHARS = 200_000  # of each text: the system prompts are tens of KB


class BodyTooLarge(ValueError):
    pass


@dataclass
class RequestInfo:
    request_model: str | None = None
    stream: bool | None = None
    max_tokens: int | None = None
    message_count: int | None = None
    session_id: str | None = None
    request_parse_error: str | None = None
    kind: str | None = None  # proxy.meter.request_kind.KINDS
    # The tool results the request carries, new since the model last spoke: [{"id", "name"}]
    # (the `tool_results` column; the dialect reads its API's shape)
    tool_results: list[dict[str, str | None]] | None = None
    project: str | None = None  # the last component of the tool's working directory (project_of)
    # the tool, its version and mode (proxy/meter/clients.py), and a hash of the conversation's first
    # message (_head); not compared: they are what the headers and the body already are
    client: Client = field(default=Client(None), compare=False)
    head: int | None = field(default=None, compare=False)


def parse_request(
    path: str, headers: Mapping[str, str], body: bytes, method: str | None = None
) -> RequestInfo:
    """`method` is optional: without it a non-JSON body is judged as a POST's."""
    get = header_getter(headers)
    info = RequestInfo()
    obj = _json_body(info, get, body, method)
    _from_path(info, path, obj)
    info.client = client_of(headers, obj)
    if isinstance(obj, dict):
        try:
            _from_body(info, obj)
            if info.client.tool in INFERRED_FOR:  # the one use of the head: their sessions, inferred
                info.head = _head(obj)
        except Exception as exc:  # a field of an unexpected type
            info.request_parse_error = f"{type(exc).__name__}: {exc}"[:200]
        _tool_results(info, path, obj)
    info.session_id = _header_session(get) or info.session_id
    info.kind = request_kind(method or "POST", path, get, obj)
    if info.kind == GENERATION and side_request(info.client.tool, obj):
        info.kind = SIDE
    return info


def _json_body(
    info: RequestInfo, get: Callable[..., Any], body: bytes, method: str | None
) -> Any:
    if not body:
        return None
    encoding = get("content-encoding", "")
    if encoding:
        try:
            body = decode_body(body, encoding)
        except Exception as exc:
            info.request_parse_error = f"content-encoding {encoding}: {exc}"[:200]
            return None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        content_type = get("content-type", "").lower()
        expected = "json" in content_type or (
            not content_type and (method or "POST").upper() not in _BODYLESS_METHODS
        )
        if expected:
            info.request_parse_error = f"body is not JSON: {exc}"[:200]
        return None


def decode_body(body: bytes, content_encoding: str, limit: int = MAX_DECODED_BYTES) -> bytes:
    """Undo each Content-Encoding (with proxy.meter.decode); more than `limit` bytes out is BodyTooLarge."""
    out = decode_all(body, content_encoding, limit + 1)
    if len(out) > limit:
        raise BodyTooLarge(f"decodes to more than {limit} bytes")
    return out


def _from_path(info: RequestInfo, path: str, obj: Any) -> None:
    """Gemini puts the model and the streaming choice in the path."""
    path = path.split("?", 1)[0]
    dialect = detect_dialect(path)
    if dialect is Gemini:
        match = _GEMINI_MODEL.search(path)
        if match:
            info.request_model = match.group(1)
        info.stream = ":streamgeneratecontent" in path.lower()
    elif dialect is not Dialect and isinstance(obj, dict):
        info.stream = False  # the generation APIs stream only when asked to


def _from_body(info: RequestInfo, obj: dict[str, Any]) -> None:
    model = obj.get("model")
    if isinstance(model, str):
        info.request_model = model
    stream = obj.get("stream")
    if isinstance(stream, bool):
        info.stream = stream
    info.max_tokens = _max_tokens(obj)
    info.message_count = _message_count(obj)
    info.session_id = _metadata_session(obj.get("metadata"))
    info.project = project_of(obj)


def project_of(obj: dict[str, Any]) -> str | None:
    """The project the request says it works in (see _CWD_NEEDLES), or None."""
    for text in _system_texts(obj):
        for needle in _CWD_NEEDLES:
            at = text.find(needle, 0, _SCAN_CHARS)
            match = _CWD_VALUE.match(text, at + len(needle)) if at >= 0 else None
            if match:
                return _last_component(match.group(1))
    for item in _items(obj.get("input")):  # Codex: the environment_context message
        for text in _texts(item.get("content")):
            if text.lstrip()[:21] == "<environment_context>":
                match = _CODEX_CWD.search(text, 0, _SCAN_CHARS)
                return _last_component(match.group(1)) if match else None
    for text in _first_user_texts(obj):  # Gemini CLI, Qwen Code: their context block
        if text.lstrip().startswith(_CONTEXT_TAGS):
            match = _CONTEXT_CWD.search(text, 0, _SCAN_CHARS)
            if match:
                return _last_component(match.group(1))
    return None


def _first_user_texts(obj: dict[str, Any]) -> list[str]:
    """The texts of the first user message of `messages` (Chat Completions) or `contents` (Gemini)."""
    for message in _items(obj.get("messages")) + _items(obj.get("contents")):
        if message.get("role") == "user":
            return _texts(message.get("content")) or _texts(message.get("parts"))
    return []


def _head(obj: dict[str, Any]) -> int | None:
    """A hash of the first message that is not the system prompt (its first 4 KB): the same through one
    conversation, another when a new one starts (proxy/meter/conversations.py)."""
    for key in ("messages", "contents", "input"):
        for message in _items(obj.get(key)):
            if message.get("role") not in ("system", "developer"):
                return hash(orjson.dumps(message, option=orjson.OPT_SORT_KEYS)[:4096])
        if isinstance(obj.get(key), str):
            return hash(obj[key][:4096])
    return None


def _items(value: Any) -> list[dict[str, Any]]:
    return [v for v in value[:_SCAN_ITEMS] if isinstance(v, dict)] if isinstance(value, list) else []


def _texts(content: Any) -> list[str]:
    """A message's or a system field's text: a string, or the text of its first blocks."""
    if isinstance(content, str):
        return [content]
    return [b["text"] for b in _items(content) if isinstance(b.get("text"), str)]


def _system_texts(obj: dict[str, Any]) -> list[str]:
    texts = _texts(obj.get("system"))  # Anthropic
    if isinstance(obj.get("instructions"), str):  # Responses
        texts.append(obj["instructions"])
    for key in ("messages", "input"):  # Chat Completions, Responses: the system prompt's messages
        for message in _items(obj.get(key)):
            if message.get("role") in ("system", "developer"):
                texts += _texts(message.get("content"))
    return texts


def _last_component(path: str) -> str | None:
    """`/home/me/src/shop/` -> `shop` (`\\` too, for Windows); `/` stays `/`."""
    path = path.strip().strip("`'\"")
    stripped = path.rstrip("/\\")
    if not stripped:
        return path[:1] or None
    return re.split(r"[/\\]", stripped)[-1][:PROJECT_MAX] or None


def _tool_results(info: RequestInfo, path: str, obj: dict[str, Any]) -> None:
    try:
        results = detect_dialect(path).tool_results(obj)
    except Exception as exc:  # a field of an unexpected type
        info.request_parse_error = info.request_parse_error or f"tool results: {type(exc).__name__}: {exc}"[:200]
        return
    if results:
        info.tool_results = [{"id": call_id, "name": name} for call_id, name in results]


def _max_tokens(obj: dict[str, Any]) -> int | None:
    config = obj.get("generationConfig")
    candidates = (
        obj.get("max_tokens"),
        obj.get("max_completion_tokens"),
        obj.get("max_output_tokens"),
        config.get("maxOutputTokens") if isinstance(config, dict) else None,
    )
    for value in candidates:
        if type(value) is int:
            return value
    return None


def _message_count(obj: dict[str, Any]) -> int | None:
    for key in ("messages", "input", "contents"):
        value = obj.get(key)
        if isinstance(value, list):
            return len(value)
        if key == "input" and isinstance(value, str):
            return 1
    return None


def _metadata_session(metadata: Any) -> str | None:
    """Claude Code's `metadata.user_id`: a JSON string holding `session_id`
    (current), or `user_<hash>_account_<uuid>_session_<uuid>` (older)."""
    if not isinstance(metadata, dict):
        return None
    user_id = metadata.get("user_id")
    if not isinstance(user_id, str) or not user_id:
        return None
    if user_id.startswith("{"):
        try:
            value = orjson.loads(user_id)
        except orjson.JSONDecodeError:
            return user_id
        session = value.get("session_id") if isinstance(value, dict) else None
        return session if isinstance(session, str) and session else None
    match = _OLD_CLAUDE_SESSION.search(user_id)
    return match.group(1) if match else user_id


def _header_session(get: Callable[..., Any]) -> str | None:
    for name in SESSION_HEADERS:
        value = get(name)
        if value:
            return value
    return None
