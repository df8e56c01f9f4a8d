"""Sessions for the agents that send no session id (Gemini CLI, Qwen Code, aider): inferred from their history.

An agent resends the whole conversation with every turn, so within one conversation the history only
grows and its first message stays the same. Requests are followed per stream: the tool, the key and the
project (the working directory its prompt states). A turn starts a new session (`~` and 12 hex digits
in `session_id`) when, compared with the stream's last turn:
- its first message differs (another conversation), or
- its history is shorter (it started again: two `gemini -p` runs), or
- its history is as long and the last turn was answered (the same first prompt sent again: a new run,
  where a retry follows a failure).
Side requests (`kind` `side`) join the stream's current session and change nothing (one that states no
project joins its tool and key's latest). The state is this
process's: with `llmtap serve --workers N` a stream's requests may reach several processes, and each
infers its own sessions.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from proxy.meter.request_kind import GENERATION, SIDE

INFERRED_FOR = frozenset({"gemini-cli", "qwen-code", "aider"})
MAX_STREAMS = 4096  # streams remembered, least recently used forgotten first

Stream = tuple[str, str | None, str | None]  # tool, key fingerprint, project


@dataclass
class _Current:
    session_id: str
    head: int | None
    length: int
    answered: bool


class Conversations:
    """The streams' current sessions. A process builds its rows on its event loop's thread; each step here
    is one dict operation, so another proxy's loop in the same process (tests) cannot corrupt it."""

    def __init__(self) -> None:
        self._streams: OrderedDict[Stream, _Current] = OrderedDict()
        self._latest: dict[tuple[str, str | None], _Current] = {}  # by tool and key: for a side request

    def session_id(self, stream: Stream, head: int | None, length: int | None, side: bool, answered: bool) -> str:
        """The session of one generation (`side`: a side request) of `stream` whose history has `length`
        messages opening with `head`; `answered`: it got its answer (a 2xx)."""
        n = length or 0
        current = self._streams.get(stream)
        if current is None and side and stream[2] is None:  # a side request states no project
            latest = self._latest.get(stream[:2])
            if latest is not None:
                return latest.session_id
        if current is not None and current.head == head and (side or _continues(current, n)):
            if not side:
                current.length, current.answered = n, answered
            self._streams.move_to_end(stream, last=True)
            return current.session_id
        current = _Current("~" + secrets.token_hex(6), head, 0 if side else n, answered and not side)
        self._streams[stream] = self._latest[stream[:2]] = current
        while len(self._streams) > MAX_STREAMS:
            forgotten, _ = self._streams.popitem(last=False)
            self._latest.pop(forgotten[:2], None)
        return current.session_id


def _continues(current: _Current, length: int) -> bool:
    return length > current.length or (length == current.length and not current.answered)


CONVERSATIONS = Conversations()  # the process's: rows of every proxy in it go through this one


def inferred_session(row: dict[str, Any], head: int | None) -> str | None:
    """The inferred session of a request's row (its `tool`, `key_fingerprint`, `project`, `kind`,
    `message_count`, `status`, `outcome`), or None where it is not inferred."""
    if row["tool"] not in INFERRED_FOR or row["kind"] not in (GENERATION, SIDE):
        return None
    status = row["status"]
    answered = status is not None and 200 <= status < 300 and row["outcome"] == "ok"
    stream = (row["tool"], row["key_fingerprint"], row["project"])
    return CONVERSATIONS.session_id(stream, head, row["message_count"], row["kind"] == SIDE, answered)
