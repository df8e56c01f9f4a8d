"""Deterministic token text and input token counts, so tests know what to expect."""

from __future__ import annotations

import math
from typing import Any

TEXT_PIECES = ("The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog", ". ")
REASONING_PIECES = ("Let", " me", " think", " about", " it", ". ")
TOOL_NAME = "lookup"

# Request fields holding prompt text, and the keys followed inside them.
_PROMPT_FIELDS = ("messages", "input", "system", "instructions", "contents", "systemInstruction")
_TEXT_KEYS = frozenset({"content", "text", "parts", "output"})


def text_piece(i: int) -> str:
    return TEXT_PIECES[i % len(TEXT_PIECES)]


def reasoning_piece(i: int) -> str:
    return REASONING_PIECES[i % len(REASONING_PIECES)]


def expected_text(n: int) -> str:
    """The visible text of a response with n text tokens."""
    return "".join(text_piece(i) for i in range(n))


def expected_reasoning(n: int) -> str:
    return "".join(reasoning_piece(i) for i in range(n))


def tool_arg_pieces(n: int) -> list[str]:
    """n argument fragments that join into a valid JSON object (for n >= 1)."""
    if n == 0:
        return []
    if n == 1:
        return ['{"text":""}']
    return ['{"text":"', *(text_piece(i) for i in range(n - 2)), '"}']


def split_arguments(text: str, n: int) -> list[str]:
    """`text` in n fragments (at least one) that join into it."""
    n = max(1, min(n, len(text)))
    size = -(-len(text) // n)
    return [text[i:i + size] for i in range(0, len(text), size)]


def declared_tools(body: dict[str, Any]) -> set[str] | None:
    """The names of the tools a request declares (Anthropic's and Responses' `name`, Chat's
    `function.name`, Gemini's `functionDeclarations`, a built-in tool's `type`); None: it declares none."""
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools:
        return None
    names = set()
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        function = tool["function"] if isinstance(tool.get("function"), dict) else {}
        for name in (tool.get("name"), function.get("name"), tool.get("type")):
            if isinstance(name, str):
                names.add(name)
        for declaration in tool.get("functionDeclarations") or ():
            if isinstance(declaration, dict) and isinstance(declaration.get("name"), str):
                names.add(declaration["name"])
    return names


def carries_tool_result(body: dict[str, Any]) -> bool:
    """Whether a request's history ends with a tool's result (Anthropic `tool_result` blocks in the
    last user message, a Chat `role: tool` message, a Responses `*_output` item, a Gemini
    `functionResponse`), read here on its own (the simulator uses none of the proxy's parsers)."""
    for key in ("messages", "input", "contents"):
        items = body.get(key)
        if not isinstance(items, list):
            continue
        last = next((m for m in reversed(items) if isinstance(m, dict) and m.get("role") != "system"), None)
        if last is None:
            return False
        if last.get("role") == "tool" or str(last.get("type", "")).endswith("_output"):
            return True
        parts = last.get("content") if key != "contents" else last.get("parts")
        return isinstance(parts, list) and any(
            isinstance(p, dict) and (p.get("type") == "tool_result" or "functionResponse" in p) for p in parts)
    return False


def _text_chars(node: Any) -> int:
    if isinstance(node, str):
        return len(node)
    if isinstance(node, list):
        return sum(_text_chars(item) for item in node)
    if isinstance(node, dict):
        return sum(_text_chars(value) for key, value in node.items() if key in _TEXT_KEYS)
    return 0


def count_input_tokens(body: dict[str, Any]) -> int:
    """ceil(characters of the prompt text / 4), at least 1.

    The prompt text is every string under messages/input/system/instructions
    (OpenAI, Anthropic) or contents/systemInstruction (Gemini), following only
    content, text, parts and output keys, so roles, ids and types don't count.
    """
    chars = sum(_text_chars(body.get(name)) for name in _PROMPT_FIELDS)
    return max(1, math.ceil(chars / 4))
