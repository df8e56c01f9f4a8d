"""The daily answers on requests shaped like the real CLIs', through the real proxy to the simulator, read
back by the CLI over the proxy's admin endpoint: the project per request, `report --by project`, the total
row, --sort, --exclude, --where (and its refusals), bench traffic left out by default, and compare's words
when the sides are too small."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import aiohttp
import pytest
from click.testing import CliRunner, Result

from proxy.cli import main
from proxy.common.headers import TAG_HEADER
from proxy.serve.server import write_state
from tests.serving import RunningProxy

from .cli_traffic import claude_tools
from .conftest import rows

ANTHROPIC = {"x-api-key": "sk-ant-test", "anthropic-version": "2023-06-01",
             "User-Agent": "claude-cli/2.1.197 (external, sdk-cli)", "x-app": "cli"}
OPENAI = {"Authorization": "Bearer sk-test"}
CODEX = {**OPENAI, "originator": "codex_exec", "User-Agent": "codex_exec/0.171.0 (Debian 12; x86_64)"}
CLINE = {**OPENAI, "User-Agent": "ai-sdk/openai-compatible"}
HI = [{"role": "user", "content": "say hi " * 20}]


def claude_body(cwd: str) -> dict[str, Any]:
    """Claude Code's shape: the system prompt's blocks, the <env> block in the last one."""
    system = [{"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
              {"type": "text", "text": "You are an interactive agent...\n\nHere is useful information about the"
               f" environment you are running in:\n<env>\nWorking directory: {cwd}\nIs directory a git repo: No\n"
               "Platform: linux\n</env>\nYou are powered by the model named Sonnet 4.5."}]
    return {"model": "claude-sonnet-4-5", "max_tokens": 1000, "stream": True, "system": system, "messages": HI,
            "tools": claude_tools()}


def codex_body(cwd: str) -> dict[str, Any]:
    """Codex's shape: instructions, then its environment_context message first in `input`."""
    context = (f"<environment_context>\n  <cwd>{cwd}</cwd>\n  <approval_policy>never</approval_policy>\n"
               "  <shell>bash</shell>\n</environment_context>")
    return {"model": "gpt-5-codex", "stream": True, "instructions": "You are Codex, based on GPT-5.",
            "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": context}]},
                      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "say hi"}]}]}


def cline_body(cwd: str | None) -> dict[str, Any]:
    """Cline's shape: its system prompt's <env> block; without one, a user message that quotes a
    working directory (a file's text, say) must not count."""
    if cwd is None:
        return {"model": "gpt-5-mini", "stream": True, "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": "the README says:\nWorking directory: /etc/secret"}]}
    system = f"You are Cline...\n\nEnvironment you are running in:\n<env>\n1. Platform: linux\n4. Working Directory: {cwd}\n</env>"
    return {"model": "gpt-5-mini", "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "system", "content": system}, *HI]}


async def post(s: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str]) -> None:
    async with s.post(url, json=body, headers=headers) as r:
        assert r.status == 200, await r.text()
        await r.read()


async def daily(base: str) -> None:
    """shop: 3 Claude Code + 2 Cline; api: 2 Claude Code + 2 Codex; no project: 1 Cline; and 4 bench
    requests (tagged as `llmtap bench` tags them) in shop."""
    async with aiohttp.ClientSession() as s:
        for _ in range(3):
            await post(s, base + "/v1/messages?beta=true", claude_body("/home/me/src/shop"), ANTHROPIC)
        for _ in range(2):
            await post(s, base + "/v1/messages?beta=true", claude_body("/home/me/work/api/"), ANTHROPIC)
            await post(s, base + "/v1/responses", codex_body("/srv/api"), CODEX)
            await post(s, base + "/v1/chat/completions", cline_body("/home/me/src/shop"), CLINE)
        await post(s, base + "/v1/chat/completions", cline_body(None), CLINE)
        for _ in range(4):
            await post(s, base + "/v1/chat/completions", cline_body("/home/me/src/shop"),
                       {**OPENAI, TAG_HEADER: "bench-20261202T000000Z-input"})


@pytest.fixture
async def recorded(proxy: RunningProxy) -> RunningProxy:
    await daily(proxy.url)
    assert proxy.flush(10)
    write_state(proxy)  # the CLI finds it, and queries it over /_llmtap/sql
    return proxy


async def cli(proxy: RunningProxy, *args: str) -> Result:
    return await asyncio.to_thread(CliRunner().invoke, main, [*args, "--db", str(proxy.config.db_path)])


async def ok(proxy: RunningProxy, *args: str) -> str:
    result = await cli(proxy, *args)
    assert result.exit_code == 0, result.output
    return result.output


def groups(output: str, by: str) -> dict[str | None, dict[str, Any]]:
    return {g[by]: g for g in json.loads(output)["groups"]}


async def test_the_project_comes_from_what_each_tool_says_and_nowhere_else(recorded: RunningProxy) -> None:
    found = rows(recorded, "SELECT tool, project, count(*) AS n FROM requests WHERE tag IS NULL GROUP BY ALL")
    assert {(r["tool"], r["project"]): r["n"] for r in found} == {
        ("claude-code", "shop"): 3, ("claude-code", "api"): 2, ("codex", "api"): 2, ("cline", "shop"): 2,
        ("cline", None): 1}  # the user message's "Working directory: /etc/secret" is not the tool's


async def test_report_by_project_with_its_total_sorted_and_without_bench(recorded: RunningProxy) -> None:
    table = await ok(recorded, "report", "--by", "project")
    assert table.startswith("10 generations from ")  # the 4 bench requests left out
    first = table.split("\n\n")[1].splitlines()
    assert [line.split()[:2] for line in first[3:]] == [["shop", "5"], ["api", "4"], ["(none)", "1"],
                                                        [first[2].split()[0]] + [first[2].split()[1]], ["total", "10"]]
    data = json.loads(await ok(recorded, "report", "--by", "project", "--format", "json"))
    assert data["total"]["requests"] == 10 == sum(g["requests"] for g in data["groups"])
    assert data["total"]["cost_usd"] == pytest.approx(sum(g["cost_usd"] or 0 for g in data["groups"]), abs=1e-5)
    assert [g["project"] for g in data["groups"]] == ["shop", "api", None]  # by count
    assert [g["project"] for g in json.loads(await ok(recorded, "report", "--by", "project", "--sort", "name",
                                                      "--format", "json"))["groups"]] == ["api", "shop", None]
    csv = await ok(recorded, "report", "--by", "project", "--format", "csv")
    assert len(csv.splitlines()) == 1 + 3 and "total" not in csv  # csv: the groups only

    bench = groups(await ok(recorded, "report", "--by", "project", "--include-bench", "--format", "json"), "project")
    assert bench["shop"]["requests"] == 9
    tagged = await ok(recorded, "report", "--tag", "bench-20261202T000000Z-input")  # bench's own hint
    assert tagged.startswith("4 generations from ")


async def test_exclude_and_where_narrow_every_report(recorded: RunningProxy) -> None:
    by_tool = groups(await ok(recorded, "report", "--by", "tool", "--exclude", "project=shop", "--format", "json"),
                     "tool")
    assert {t: g["requests"] for t, g in by_tool.items()} == {"claude-code": 2, "codex": 2, "cline": 1}  # NULL stays
    assert "cline" not in groups(await ok(recorded, "report", "--by", "tool", "--exclude", "tool=cline",
                                          "--exclude", "tool=codex", "--format", "json"), "tool")
    where = groups(await ok(recorded, "report", "--by", "project", "--where", "dialect = 'anthropic'",
                            "--where", "request_model LIKE 'claude%'", "--format", "json"), "project")
    assert {p: g["requests"] for p, g in where.items()} == {"shop": 3, "api": 2}

    sessions = json.loads(await ok(recorded, "sessions", "--format", "json", "--exclude", "tool=claude-code"))
    every = json.loads(await ok(recorded, "sessions", "--format", "json", "--include-bench"))
    assert sum(s["requests"] for s in sessions) == 2 + 3 and sum(s["requests"] for s in every) == 14
    errors = json.loads(await ok(recorded, "errors", "--format", "json", "--where", "project = 'api'"))
    assert errors["requests"] == 4 and errors["failed"] == 0

    for refused in ("tag IN (SELECT content FROM read_text('/etc/passwd'))", "1=1); DROP TABLE requests; --",
                    "EXISTS (SELECT * FROM 'llmtap.duckdb.wal')"):
        result = await cli(recorded, "report", "--where", refused)
        assert result.exit_code == 2 and "Invalid value for --where" in result.output, result.output
    result = await cli(recorded, "report", "--exclude", "route=/")
    assert result.exit_code == 2 and "FIELD one of tag, model, tool, project" in result.output


async def test_compare_by_tool_on_daily_traffic_says_why_in_words(recorded: RunningProxy) -> None:
    found = await cli(recorded, "compare", "--by", "tool")
    assert found.exit_code == 1
    assert ("compare --by tool needs two sides with 10+ successful requests each; found 0; too few:"
            " claude-code (5), cline (3), codex (2)") in found.output  # bench's 4 cline rows left out
    named = await ok(recorded, "compare", "--by", "tool", "claude-code", "codex")
    assert "cannot compare: too few requests (claude-code has 5; codex has 2; 10 needed on each side)" in named
    tagged = await cli(recorded, "compare", "--by", "tag", "bench-20261202T000000Z-input", "(none)")
    assert "too few streamed requests (bench-20261202T000000Z-input has 4; 10 needed on each side)" in tagged.output
    refused = await cli(recorded, "compare", "--where", "tool = 'codex'", "--where", "x IN (SELECT * FROM read_csv('/etc/passwd'))")
    assert refused.exit_code == 2 and "read_csv() does not run through the proxy" in refused.output


async def test_top_counts_bench_apart_unless_asked(recorded: RunningProxy) -> None:
    from analysis.top import run as top_run

    text = "\n".join(line.text for line in await top_run.once(recorded.admin, 300.0))
    assert re.search(r"^finished 10 ", text, re.M), text
    assert re.search(r"^errors 5m  none   \(ok 10\)   4 bench not shown \(--include-bench\)$", text, re.M), text
    every = "\n".join(line.text for line in await top_run.once(recorded.admin, 300.0, bench=True))
    assert re.search(r"^finished 14 ", every, re.M) and "bench not shown" not in every, every
