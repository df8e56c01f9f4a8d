"""The numbers the README and docs/ copy from the code (queue bounds, caps, defaults, timeouts) are
the code's: each phrase that quotes one is found in the pages it must be in, and every copy of it
in README.md and docs/ says what the constant says today."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from proxy.meter import decode, meter
from proxy.record import admin_sql, store
from proxy.relay import body_budget
from proxy.serve import server, spill
from proxy.settings.config import ServeConfig

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}
DEFAULTS = ServeConfig()


def number(text: str) -> float:
    return float(text.replace(",", ""))


def word(text: str) -> float:
    return float(next(n for n, w in WORDS.items() if w == text))


def default(function: Callable[..., object], parameter: str) -> Any:
    return inspect.signature(function).parameters[parameter].default


# (a pattern whose one group is the number, how to read it, the constant, the pages that must quote it)
NUMBERS: list[tuple[str, Callable[[str], float], float, tuple[str, ...]]] = [
    (r"([\d,]+) request rows", number, store.MAX_PENDING_REQUESTS, ("guarantees.md",)),
    (r"([\d,]+) chunk rows", number, store.MAX_PENDING_CHUNKS, ("guarantees.md",)),
    (r"(\d+) MB of bodies", number, store.MAX_PENDING_BODY_BYTES / 2**20, ("guarantees.md",)),
    (r"(?<![\d,])(?<!to )(\d[\d,]*) output events", number, meter.MAX_EVENTS_KEPT, ("guarantees.md", "security.md")),
    (r"(\d+) MiB at a time", number, decode.PIECE / 2**20, ("guarantees.md",)),
    (r"at a time, at most (\d+) MiB", number, decode.DEFAULT_LIMIT / 2**20, ("guarantees.md",)),
    (r"an SSE event over (\d+) MiB", number, meter.MAX_SSE_EVENT / 2**20, ("guarantees.md",)),
    (r"`--max-body-mb`, (\d+) MiB", number, DEFAULTS.max_body_mb, ("guarantees.md",)),
    (r"`--body-memory-mb`, (\d+) MiB", number, DEFAULTS.body_memory_mb, ("guarantees.md",)),
    (r"`Retry-After: (\d+)`", number, body_budget.RETRY_AFTER_S, ("guarantees.md",)),
    (r"`--sql-timeout` \((\d+) s", number, DEFAULTS.sql_timeout_s, ("guarantees.md", "security.md")),
    (r"`--sql-max-mb`(?:,| \() ?(\d+) MiB", number, DEFAULTS.sql_max_mb, ("guarantees.md", "security.md")),
    (r"(\w+) threads of its own", word, admin_sql.THREADS, ("guarantees.md", "security.md")),
    (r"threads of its own \((\w+) more wait", word, admin_sql.QUEUE, ("guarantees.md",)),
    (r"threads of its own run queries and (\w+) more may wait", word, admin_sql.QUEUE, ("security.md",)),
    (r"open files to ([\d,]+)", number, default(server.raise_open_files, "want"), ("guarantees.md",)),
    (r"A clean stop waits (\d+) s for the disk", number, default(store.Store.close, "timeout"),
     ("guarantees.md",)),
    (r"its start and every (\d+) s, for a worker that spills", number, spill.RESCAN_S, ("guarantees.md",)),
]


def text_of(page: Path) -> str:
    return re.sub(r"\s+", " ", page.read_text())  # a phrase may wrap


@pytest.mark.parametrize(("pattern", "read", "constant", "pages"), NUMBERS, ids=[n[0] for n in NUMBERS])
def test_every_copy_of_a_number_is_the_codes(pattern: str, read: Callable[[str], float], constant: float,
                                            pages: tuple[str, ...]) -> None:
    found = {page.name: [m.group(1) for m in re.finditer(pattern, text_of(page))] for page in PAGES}
    assert [p for p in pages if not found[p]] == [], f"{pattern!r} is no longer in these pages"
    stale = [f"{name}: {value}" for name, values in found.items() for value in values if read(value) != constant]
    assert stale == [], f"the code says {constant:g}"


def test_the_crash_loss_quoted_is_within_the_flush_interval_the_code_uses() -> None:
    """"About the last second (1.13 s)": the writer's interval, and the measured loss under the bound
    tests/test_faults_storage.py holds it to (the interval and the write under way)."""
    assert DEFAULTS.flush_interval_s == default(store.Store.__init__, "flush_interval_s") == 1.0  # "the last second"
    measured = {page.name: re.findall(r"(?:last second \(|measured:? at most )(\d+\.\d+) s", text_of(page))
                for page in PAGES}
    assert measured["guarantees.md"]
    values = {float(v) for vs in measured.values() for v in vs}
    assert len(values) == 1 and values.pop() < DEFAULTS.flush_interval_s + 0.5, measured
