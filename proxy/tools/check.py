"""One `llmtap doctor` finding: OK, WARN or FAIL, what was seen, and the fix."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Status = Literal["OK", "WARN", "FAIL"]


@dataclass(frozen=True)
class Check:
    status: Status
    subject: str
    detail: str
    fix: str | None = None

    def render(self) -> str:
        text = f"{self.status:<5} {self.subject}: {self.detail}"
        if self.fix:
            text += "\n" + "\n".join(f"      fix: {line}" if i == 0 else f"           {line}"
                                     for i, line in enumerate(self.fix.splitlines()))
        return text


def ok(subject: str, detail: str) -> Check:
    return Check("OK", subject, detail)


def warn(subject: str, detail: str, fix: str | None = None) -> Check:
    return Check("WARN", subject, detail, fix)


def fail(subject: str, detail: str, fix: str | None = None) -> Check:
    return Check("FAIL", subject, detail, fix)
