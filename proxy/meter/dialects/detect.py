"""Which dialect a request path speaks, by its suffix.

Routes may put any prefix before the API path (`/openrouter/api/v1/...`), so
only the end of the path counts; the query string is ignored.
"""

from __future__ import annotations

import functools

from proxy.meter.dialects.anthropic import Anthropic
from proxy.meter.dialects.base import Dialect
from proxy.meter.dialects.gemini import Gemini
from proxy.meter.dialects.openai_chat import OpenAIChat
from proxy.meter.dialects.openai_responses import OpenAIResponses

_SUFFIXES: tuple[tuple[str, type[Dialect]], ...] = (
    ("/chat/completions", OpenAIChat),
    ("/responses", OpenAIResponses),
    # Codex's compaction call answers with one JSON body; on_body reads it.
    ("/responses/compact", OpenAIResponses),
    # `/messages/count_tokens` is not a generation and falls through to generic.
    ("/messages", Anthropic),
    (":streamgeneratecontent", Gemini),
    (":generatecontent", Gemini),
)


@functools.lru_cache(maxsize=1024)  # a client uses a handful of paths
def detect_dialect(path: str) -> type[Dialect]:
    path = path.split("?", 1)[0].rstrip("/").replace("%3A", ":").replace("%3a", ":")
    lowered = path.lower()
    for suffix, dialect in _SUFFIXES:
        if lowered.endswith(suffix):
            return dialect
    return Dialect
