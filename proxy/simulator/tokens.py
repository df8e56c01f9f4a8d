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
