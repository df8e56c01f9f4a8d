"""The account limits a real upstream states on every response, and enforces.

Each credential is an account (its hash; the simulator keeps no key). An API key has, per window of
`ratelimit_window_s`, a budget of requests, input tokens and output tokens; every response says what
is left, in the API's own headers (Anthropic's `anthropic-ratelimit-*`, OpenAI's `x-ratelimit-*`), and
a request over budget gets a 429 with `retry-after`. A Claude login (`Bearer sk-ant-oat…`) is a
subscription instead: a 5-hour and a 7-day budget of tokens, stated as Anthropic's unified headers
(`anthropic-ratelimit-unified-{5h,7d}-{utilization,reset,status}`), 429 once the 5-hour one is spent.
Gemini and the ChatGPT backend state nothing. Tokens are counted when a response starts: the prompt
and the planned output, as the real ones reserve them.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from proxy.simulator.errors import Api

WARNING_AT = 0.8  # a subscription window this used is `allowed_warning`


@dataclass(slots=True)
class Window:
    limit: int
    seconds: float
    used: int = 0
    starts: float = 0.0  # wall-clock seconds

    def roll(self, now: float) -> None:
        if now >= self.starts + self.seconds:
            self.used, self.starts = 0, now

    @property
    def resets(self) -> float:
        return self.starts + self.seconds

    @property
    def remaining(self) -> int:
        return max(self.limit - self.used, 0)


@dataclass(slots=True)
class Account:
    subscription: bool
    windows: dict[str, Window] = field(default_factory=dict)


def account_key(headers: Any) -> tuple[str, bool] | None:
    """The account a request's credential is (a hash), and whether it is a Claude login; None: no
    credential, no limits."""
    auth = (headers.get("authorization") or "").strip()
    secret = auth.partition(" ")[2].strip() if auth.lower().startswith("bearer ") else auth
    secret = secret or headers.get("x-api-key") or headers.get("x-goog-api-key") or ""
    if not secret:
        return None
    subscription = secret.startswith("sk-ant-oat") or "oauth-" in (headers.get("anthropic-beta") or "")
    return hashlib.sha256(secret.encode()).hexdigest(), subscription


class Quotas:
    """Every account's windows, by the limits of the config in force."""

    def __init__(self) -> None:
        self.accounts: dict[str, Account] = {}

    def account(self, config: Any, headers: Any) -> Account | None:
        found = account_key(headers)
        if found is None:
            return None
        key, subscription = found
        account = self.accounts.get(key)
        if account is None:
            account = self.accounts[key] = Account(subscription)
        now = time.time()
        if subscription:
            limits = {"5h": (config.subscription_5h_tokens, 5 * 3600.0),
                      "7d": (config.subscription_7d_tokens, 7 * 86400.0)}
        else:
            window = config.ratelimit_window_s
            limits = {"requests": (config.ratelimit_requests, window),
                      "input_tokens": (config.ratelimit_input_tokens, window),
                      "output_tokens": (config.ratelimit_output_tokens, window)}
        for name, (limit, seconds) in limits.items():
            w = account.windows.get(name)
            if w is None:
                w = account.windows[name] = Window(limit, seconds, 0, now)
            w.limit, w.seconds = limit, seconds
            w.roll(now)
        return account


def spent(account: Account) -> float | None:
    """Seconds until the account may ask again, when a budget is spent; None while it may."""
    now = time.time()
    names = ("5h",) if account.subscription else ("requests", "input_tokens", "output_tokens")
    waits = [w.resets - now for name in names if (w := account.windows[name]).remaining <= 0]
    return max(max(waits), 0.0) if waits else None


def consume(account: Account, input_tokens: int, output_tokens: int) -> None:
    if account.subscription:
        for w in account.windows.values():
            w.used += input_tokens + output_tokens
    else:
        account.windows["requests"].used += 1
        account.windows["input_tokens"].used += input_tokens
        account.windows["output_tokens"].used += output_tokens


def _rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(math.ceil(seconds), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _duration(seconds: float) -> str:
    """OpenAI's form: '20ms', '1.5s', '6m0s'."""
    if seconds < 1:
        return f"{max(round(seconds * 1000), 1)}ms"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{rest:.0f}s" if minutes else f"{rest:.3g}s"


def _status(used: float) -> str:
    return "rejected" if used >= 1 else "allowed_warning" if used >= WARNING_AT else "allowed"


def headers(api: Api, account: Account | None) -> dict[str, str]:
    """The limit headers of a response in `api`'s form, after this request's share was taken."""
    if account is None or api == "gemini":
        return {}
    now = time.time()
    w = account.windows
    if account.subscription:
        if api != "anthropic":
            return {}
        out: dict[str, str] = {}
        for name in ("5h", "7d"):
            used = w[name].used / w[name].limit if w[name].limit else 1.0
            out[f"anthropic-ratelimit-unified-{name}-utilization"] = f"{min(used, 1.0):.4g}"
            out[f"anthropic-ratelimit-unified-{name}-reset"] = str(math.ceil(w[name].resets))
            out[f"anthropic-ratelimit-unified-{name}-status"] = _status(used)
        out["anthropic-ratelimit-unified-status"] = out["anthropic-ratelimit-unified-5h-status"]
        out["anthropic-ratelimit-unified-representative-claim"] = "five_hour"
        out["anthropic-ratelimit-unified-reset"] = out["anthropic-ratelimit-unified-5h-reset"]
        return out
    requests, inputs, outputs = w["requests"], w["input_tokens"], w["output_tokens"]
    if api == "anthropic":
        scarcer = min(inputs, outputs, key=lambda w: w.remaining / w.limit if w.limit else 0.0)
        out = {}
        for name, window in (("requests", requests), ("input-tokens", inputs), ("output-tokens", outputs)):
            out[f"anthropic-ratelimit-{name}-limit"] = str(window.limit)
            out[f"anthropic-ratelimit-{name}-remaining"] = str(window.remaining)
            out[f"anthropic-ratelimit-{name}-reset"] = _rfc3339(window.resets)
        # the most restrictive of the two token limits, as Anthropic states it
        out["anthropic-ratelimit-tokens-limit"] = str(scarcer.limit)
        out["anthropic-ratelimit-tokens-remaining"] = str(scarcer.remaining)
        out["anthropic-ratelimit-tokens-reset"] = _rfc3339(scarcer.resets)
        return out
    tokens_limit = inputs.limit + outputs.limit
    tokens_left = max(tokens_limit - inputs.used - outputs.used, 0)
    return {
        "x-ratelimit-limit-requests": str(requests.limit),
        "x-ratelimit-remaining-requests": str(requests.remaining),
        "x-ratelimit-reset-requests": _duration(max(requests.resets - now, 0)),
        "x-ratelimit-limit-tokens": str(tokens_limit),
        "x-ratelimit-remaining-tokens": str(tokens_left),
        "x-ratelimit-reset-tokens": _duration(max(inputs.resets - now, 0)),
    }
