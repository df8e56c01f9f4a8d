"""Quota headroom: the simulated upstream states (and enforces) an account's limits as the real ones do,
and every row keeps them typed: an API key's remaining requests and tokens, a subscription's 5-hour and
7-day windows, retry-after."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import aiohttp
import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.meter import ratelimits
from proxy.meter.fingerprint import credential_kind
from .serving import RunningProxy
from proxy.simulator.app import Simulator

from .conftest import rows

API_KEY = {"x-api-key": "sk-ant-api03-sim-not-real", "anthropic-version": "2023-06-01"}
CLAUDE_LOGIN = {"authorization": "Bearer sk-ant-oat01-sim-not-real", "anthropic-beta": "oauth-2025-04-20",
                "anthropic-version": "2023-06-01"}
OPENAI_KEY = {"authorization": "Bearer sk-proj-sim-not-real"}
MESSAGES = {"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": [{"role": "user", "content": "hi there"}]}
CHAT = {"model": "gpt-5", "messages": [{"role": "user", "content": "hi there"}]}


async def post(p: RunningProxy, path: str, body: dict, headers: dict[str, str]) -> aiohttp.ClientResponse:
    async with aiohttp.ClientSession() as session:
        async with session.post(p.url + path, json=body, headers=headers) as resp:
            await resp.read()
            return resp


def test_the_header_families_parse_typed() -> None:
    at = datetime(2026, 12, 1, 14, 2, 0, tzinfo=UTC)
    headers = CIMultiDictProxy(CIMultiDict({
        "anthropic-ratelimit-requests-limit": "50", "anthropic-ratelimit-requests-remaining": "49",
        "anthropic-ratelimit-requests-reset": "2026-12-01T14:03:00Z",
        "anthropic-ratelimit-input-tokens-limit": "30000", "anthropic-ratelimit-input-tokens-remaining": "0",
        "anthropic-ratelimit-input-tokens-reset": "2026-12-01T14:03:00+00:00",
        "x-ratelimit-limit-tokens": "ignored-here", "content-type": "application/json",
    }))
    found = ratelimits.raw(headers)
    row = ratelimits.parse(found, "7", None, at)
    assert row["ratelimit_requests_limit"] == 50 and row["ratelimit_requests_remaining"] == 49
    assert row["ratelimit_requests_reset"] == datetime(2026, 12, 1, 14, 3, tzinfo=UTC)
    assert row["ratelimit_input_tokens_remaining"] == 0 and row["retry_after_s"] == 7.0
    openai = ratelimits.parse(ratelimits.raw({"x-ratelimit-limit-requests": "10000", "x-ratelimit-remaining-requests": "9999",
                                              "x-ratelimit-reset-requests": "6m0s", "x-ratelimit-limit-tokens": "2000000",
                                              "x-ratelimit-remaining-tokens": "1999000", "x-ratelimit-reset-tokens": "20ms"}),
                              "Tue, 01 Dec 2026 14:02:30 GMT", None, at)
    assert openai["ratelimit_requests_reset"] == at + timedelta(minutes=6)
    assert openai["ratelimit_tokens_reset"] == at + timedelta(milliseconds=20)
    assert openai["ratelimit_tokens_remaining"] == 1_999_000 and openai["retry_after_s"] == 30.0
    unified = ratelimits.parse(ratelimits.raw({"anthropic-ratelimit-unified-status": "allowed_warning",
                                               "anthropic-ratelimit-unified-5h-utilization": "0.83",
                                               "anthropic-ratelimit-unified-5h-reset": "1796140800",
                                               "anthropic-ratelimit-unified-5h-status": "allowed_warning",
                                               "anthropic-ratelimit-unified-7d-utilization": "0.2"}), None, None, at)
    assert unified["ratelimit_status"] == "allowed_warning" and unified["ratelimit_5h_utilization"] == 0.83
    assert unified["ratelimit_5h_reset"] == datetime.fromtimestamp(1796140800, UTC)
    assert unified["ratelimit_7d_utilization"] == 0.2 and unified["ratelimit_7d_reset"] is None
    assert ratelimits.raw({"content-type": "text/event-stream"}) is None
    assert ratelimits.duration_seconds("1h2m3.5s") == 3723.5 and ratelimits.duration_seconds("soon") is None


def test_the_credential_kind_is_told_from_its_form() -> None:
    assert credential_kind(API_KEY) == "api_key"
    assert credential_kind(CLAUDE_LOGIN) == "claude_login"
    assert credential_kind({"authorization": "Bearer eyJhbGciOi.eyJzdWIi.c2ln", "chatgpt-account-id": "acct"}) \
        == "chatgpt_login"
    assert credential_kind(OPENAI_KEY) == "api_key"
    assert credential_kind({"authorization": "Bearer local-token"}) == "bearer"
    assert credential_kind({}, {"key": "AIza-sim"}) == "api_key"
    assert credential_kind({}) is None


async def test_an_api_key_s_headroom_is_recorded_until_the_429(sim: Simulator, proxy: RunningProxy) -> None:
    sim.config = replace(sim.config, ratelimit_requests=3, ttft_ms=1, itl_ms=0)
    statuses = [(await post(proxy, "/v1/messages", {**MESSAGES, "stream": n % 2 == 0}, API_KEY)).status
                for n in range(4)]
    assert statuses == [200, 200, 200, 429]
    got = rows(proxy)
    assert [r["ratelimit_requests_remaining"] for r in got] == [2, 1, 0, 0]
    assert {r["ratelimit_requests_limit"] for r in got} == {3}
    assert all(r["credential_kind"] == "api_key" for r in got)
    last = got[-1]
    assert last["status"] == 429 and last["error_type"] == "rate_limit_error"
    assert 1 <= last["retry_after_s"] <= 60
    assert last["ratelimit_requests_reset"] > last["started_at"]
    assert got[0]["ratelimit_input_tokens_remaining"] < got[0]["ratelimit_input_tokens_limit"]
    assert got[0]["response_model"] == "claude-sonnet-4-5-20250929"  # the snapshot, as the upstream says it


async def test_openai_s_headers_and_a_subscription_s_windows(sim: Simulator, proxy: RunningProxy) -> None:
    sim.config = replace(sim.config, subscription_5h_tokens=100, ttft_ms=1, itl_ms=0, tokens=20)
    assert (await post(proxy, "/v1/chat/completions", CHAT, OPENAI_KEY)).status == 200
    statuses = [(await post(proxy, "/v1/messages", MESSAGES, CLAUDE_LOGIN)).status for _ in range(8)]
    assert statuses[0] == 200 and statuses[-1] == 429
    chat, *claude = rows(proxy)
    assert chat["ratelimit_requests_limit"] == 30_000 and chat["ratelimit_requests_remaining"] == 29_999
    assert chat["ratelimit_tokens_remaining"] < chat["ratelimit_tokens_limit"]
    assert chat["ratelimit_5h_utilization"] is None and chat["credential_kind"] == "api_key"
    used = [r["ratelimit_5h_utilization"] for r in claude]
    assert used == sorted(used) and used[0] > 0 and used[-1] == 1.0
    assert all(r["credential_kind"] == "claude_login" for r in claude)
    assert claude[-1]["ratelimit_status"] == "rejected" and claude[-1]["status"] == 429
    assert claude[0]["ratelimit_5h_reset"] - claude[0]["started_at"] <= timedelta(hours=5, seconds=5)
    assert claude[0]["ratelimit_7d_utilization"] < claude[0]["ratelimit_5h_utilization"]
    assert claude[0]["ratelimit_requests_limit"] is None  # a subscription states no per-minute budget


@pytest.mark.parametrize("headers", [{}, {"x-goog-api-key": "AIza-sim"}])
async def test_no_headers_no_limit_columns(sim: Simulator, proxy: RunningProxy, headers: dict[str, str]) -> None:
    body = {"contents": [{"parts": [{"text": "hi"}]}]}
    assert (await post(proxy, "/v1beta/models/gemini-2.5-flash:generateContent", body, headers)).status == 200
    (row,) = rows(proxy)
    assert all(row[name] is None for name in ratelimits.NAMES)
