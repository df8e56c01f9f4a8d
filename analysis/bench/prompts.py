"""Prompts of a target input length, without a tokenizer.

A prompt is a unique opening line (so no request reuses another's cached
prefix), an instruction to write at length, and the first n words of one fixed
word sequence. Calibration sends two prompts (short and long, max_tokens 1),
reads the input tokens the upstream reports in its usage, and fits
tokens = overhead + per_word * words; a target length then gives its word count.
Two points rather than one keep the chat template's fixed tokens out of the
per-word rate, which matters for short prompts.
"""

from __future__ import annotations

import itertools
import random
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

# Common English words: most are one token in any modern tokenizer.
WORDS = (
    "time year people way day man thing woman life child world school state family student group country "
    "problem hand part place case week company system program question work government number night point "
    "home water room mother area money story fact month lot right study book eye job word business issue "
    "side kind head house service friend father power hour game line end member law car city community "
    "name president team minute idea kid body information back parent face others level office door health "
    "person art war history party result change morning reason research girl guy moment air teacher force "
    "education foot boy age policy process music market sense nation plan college interest death experience "
    "effect use class control care field development role effort rate heart drug show leader light voice "
    "wife police mind price report decision son view relationship town road arm difference value building"
).split()

INSTRUCTION = ("Write a long, detailed story that uses the words below. Keep writing until you are stopped; "
               "do not summarise and do not stop early.\n\n")
CALIBRATION_WORDS = (40, 1200)

Measure = Callable[[str], Awaitable[int | None]]  # sends a prompt, returns the input tokens reported


def word_sequence(n: int) -> list[str]:
    """The first n words of one fixed pseudo-random sequence (the same for every prompt)."""
    rng = random.Random(20240601)
    return [rng.choice(WORDS) for _ in range(n)]


@dataclass(frozen=True, slots=True)
class Calibration:
    overhead: float  # tokens of a prompt with no words: template, opening line, instruction
    per_word: float
    measured: bool = True  # False: the upstream reported no usage, these are guesses

    def words_for(self, tokens: int) -> int:
        return max(1, round((tokens - self.overhead) / self.per_word))


GUESS = Calibration(overhead=20.0, per_word=1.3, measured=False)


class PromptMaker:
    """Prompts of a given token length; each one opens with a new id."""

    def __init__(self, calibration: Calibration = GUESS, run_id: str | None = None) -> None:
        self.calibration = calibration
        self.run_id = run_id or secrets.token_hex(4)
        self._counter = itertools.count(1)
        self._words: list[str] = []

    def prompt_words(self, words: int) -> str:
        if len(self._words) < words:
            self._words = word_sequence(max(words, 2 * len(self._words)))
        opening = f"Request {self.run_id}-{next(self._counter):06d}.\n"
        return opening + INSTRUCTION + " ".join(self._words[:words])

    def prompt(self, tokens: int) -> str:
        return self.prompt_words(self.calibration.words_for(tokens))


async def calibrate(maker: PromptMaker, measure: Measure) -> Calibration:
    """Fit overhead and tokens per word from two prompts; GUESS when usage is missing."""
    short, long = CALIBRATION_WORDS
    t_short = await measure(maker.prompt_words(short))
    t_long = await measure(maker.prompt_words(long))
    if t_short is None or t_long is None or t_long <= t_short:
        return GUESS
    per_word = (t_long - t_short) / (long - short)
    calibration = Calibration(overhead=max(0.0, t_short - per_word * short), per_word=per_word)
    maker.calibration = calibration
    return calibration
