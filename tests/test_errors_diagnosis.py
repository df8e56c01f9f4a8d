"""`llmtap errors`: the groups, each diagnosis rule, and the output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from analysis import diagnose as d
from analysis.diagnose import ErrorGroup, diagnose
from .analysis_fixture import build_fixture_db
from proxy.cli import main


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("errors") / "fixture.duckdb"
    build_fixture_db(path)
    return path


def run(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def group(status: int | None = None, outcome: str = "http_error", **kw: object) -> ErrorGroup:
    return ErrorGroup(outcome=outcome, status=status, error_type=None, count=1, **kw)  # type: ignore[arg-type]


# -- each rule, on a group made for it -----------------------------------------------

def test_auth_shows_the_keys_seen() -> None:
    line = d.auth(group(401, keys=["(none)", "k:9d41b7aa03c2"]))
    assert line is not None
    assert "stray whitespace" in line and "keys seen: (none), k:9d41b7aa03c2" in line
    forbidden = d.auth(group(403, keys=["k:7f3a9c1e5b20"]))
    assert forbidden is not None and "not do this" in forbidden and "k:7f3a9c1e5b20" in forbidden
    assert d.auth(group(404)) is None


@pytest.mark.parametrize("path, segment", [
    ("/v1/v1/messages", "v1"), ("/anthropic/v1/v1/messages", "v1"), ("/v1beta/v1beta/models/g:x", "v1beta"),
])
def test_doubled_version(path: str, segment: str) -> None:
    line = d.doubled_version(group(404, paths=[path]))
    assert line == (f"path {path} repeats /{segment}: the base URL already ends in /{segment} and"
                    f" the client adds another: remove /{segment} from the base URL")


@pytest.mark.parametrize("path", ["/v1/messages", "/v10/v1/x", "/v1/v12/x"])
def test_doubled_version_needs_the_same_segment_twice(path: str) -> None:
    assert d.doubled_version(group(404, paths=[path])) is None


def test_doubled_version_only_for_404() -> None:
    assert d.doubled_version(group(400, paths=["/v1/v1/messages"])) is None


@pytest.mark.parametrize("path, missing", [
    ("/chat/completions", True), ("/local/responses", True), ("/v1/chat/completions", False),
    ("/v1beta/models/gemini:streamGenerateContent", False), ("/openai/v1/responses", False),
])
def test_missing_version(path: str, missing: bool) -> None:
    line = d.missing_version(group(404, paths=[path]))
    assert (line is not None) == missing
    if missing:
        assert line == (f"path {path} has no /v1: OpenAI-style clients append only /chat/completions"
                        " or /responses, so their base URL must end in /v1")


def test_unknown_model_needs_a_message_about_the_model() -> None:
    g = group(404, models=["gpt-5o"], messages=["The model `gpt-5o` does not exist"])
    assert d.unknown_model(g) == "unknown model gpt-5o: check the model id for typos, and that the key may use it"
    assert d.unknown_model(group(404, models=["x"], messages=["Not Found"])) is None
    assert d.unknown_model(group(400, models=["x"], messages=["model: x"])) is None


def test_rate_limited_shows_retry_after() -> None:
    assert d.rate_limited(group(429, retry_after=["12", "30"])) == (
        "rate limited (retry-after: 12 s, 30 s): lower the request rate or concurrency, or raise the quota")
    assert d.rate_limited(group(429, retry_after=["Wed, 21 Oct 2026 07:28:00 GMT"])) == (
        "rate limited (retry-after: Wed, 21 Oct 2026 07:28:00 GMT): lower the request rate or"
        " concurrency, or raise the quota")
    assert d.rate_limited(group(429)) == (
        "rate limited: lower the request rate or concurrency, or raise the quota")
    assert d.rate_limited(group(503)) is None


@pytest.mark.parametrize("status, word", [(500, "failing"), (502, "failing"), (503, "overloaded"), (529, "overloaded")])
def test_upstream_failing(status: int, word: str) -> None:
    assert d.upstream_failing(group(status)) == (
        f"upstream {word} (HTTP {status}): retry later with backoff; check the provider's status page")


def test_upstream_failing_is_not_for_llmtaps_own_errors_or_4xx() -> None:
    assert d.upstream_failing(group(502, outcome="proxy_error")) is None
    assert d.upstream_failing(group(429)) is None
    assert d.upstream_failing(group(502, outcome="upstream_unreachable")) is None
    assert d.upstream_failing(group(504, outcome="upstream_timeout")) is None


def test_stream_error() -> None:
    overloaded = ErrorGroup("stream_error", 200, "overloaded_error", 1)
    assert d.stream_error(overloaded) == (
        "the upstream sent an error event mid-stream (overloaded_error): the answer is cut short;"
        " the upstream is overloaded: retry later")
    other = ErrorGroup("stream_error", 200, "api_error", 1)
    assert d.stream_error(other) == (
        "the upstream sent an error event mid-stream (api_error): the answer is cut short;"
        " retry, and check the message")
    assert d.stream_error(ErrorGroup("http_error", 529, "overloaded_error", 1)) is None


def test_llmtaps_own_rejections() -> None:
    no_route = ErrorGroup("http_error", 404, "no_route", 3, paths=["/openai/v1/chat/completions"])
    assert d.no_route(no_route) == (
        "llmtap has no route for /openai/v1/chat/completions: fix the client's base URL, or add"
        " `llmtap serve --route PREFIX=URL`")
    connect = ErrorGroup("http_error", 405, "method_not_allowed", 1)
    line = d.forward_proxy(connect)
    assert line is not None and "forward proxy" in line
    too_large = ErrorGroup("http_error", 413, "request_too_large", 1)
    assert d.too_large(too_large) == "request bodies over llmtap's limit: raise `llmtap serve --max-body-mb`"
    plain_404 = ErrorGroup("http_error", 404, "not_found_error", 1)
    assert (d.no_route(plain_404), d.forward_proxy(plain_404), d.too_large(plain_404)) == (None, None, None)


def test_unreachable_names_the_host() -> None:
    line = d.unreachable(group(None, outcome="upstream_unreachable", hosts=["llm.internal:8000"]))
    assert line is not None and "llm.internal:8000" in line and "HTTPS_PROXY" in line
    assert d.unreachable(group(500)) is None


@pytest.mark.parametrize("rule, outcome, words", [
    (d.timed_out, "upstream_timeout", "--idle-timeout"),
    (d.client_disconnected, "client_disconnected", "Ctrl-C"),
    (d.stream_truncated, "stream_truncated", "terminal event"),
    (d.proxy_error, "proxy_error", "llmtap serve"),
])
def test_outcome_rules(rule: d.Rule, outcome: str, words: str) -> None:
    line = rule(group(200, outcome=outcome))
    assert line is not None and words in line
    assert rule(group(200, outcome="http_error")) is None


def test_empty_choices() -> None:
    line = d.empty_choices(group(200, outcome="client_disconnected", empty_choices_chunks=2))
    assert line is not None and line.startswith("2 chunks with empty `choices`") and "reading choices" in line
    assert d.empty_choices(group(200, outcome="client_disconnected")) is None


def test_no_key_sent_is_said_only_when_a_request_sent_none() -> None:
    assert "no key sent" in d.auth(group(401, keys=["(none)", "k:9d41b7aa03c2"]))  # type: ignore[operator]
    assert "no key sent" not in d.auth(group(401, keys=["k:9d41b7aa03c2"]))  # type: ignore[operator]


def test_a_failed_probe_is_harmless_and_only_that() -> None:
    g = group(404, paths=["/"], kinds=["probe"], messages=["Not Found"])
    assert diagnose(g) == [d.probe(g)] and "harmless" in diagnose(g)[0]
    assert d.probe(group(404, paths=["/"], kinds=["probe", "generation"])) is None


def test_every_rule_is_in_the_table() -> None:
    names = [name for name, _ in d.RULES]
    assert len(names) == len(set(names)) == 17
    assert all(getattr(d, name) is rule for name, rule in d.RULES)


def test_diagnose_falls_back_to_a_generic_line() -> None:
    assert diagnose(group(418, messages=["I'm a teapot"])) == ["no known cause: I'm a teapot"]
    assert diagnose(group(404, paths=["/v1/messages"], messages=["Not Found"])) == [
        "the upstream has no such endpoint: Not Found: check the client's base URL and the path"]


def test_diagnose_gives_every_matching_cause() -> None:
    g = group(404, paths=["/v1/v1/messages"], models=["claude-sonet-4"], messages=["model: claude-sonet-4"])
    assert [line.split(":")[0] for line in diagnose(g)] == ["path /v1/v1/messages repeats /v1", "unknown model claude-sonet-4"]


# -- the command on the fixture -----------------------------------------------------------

ERRORS = """\
15 failed of 31 requests (48.4%) from 2026-11-28 09:02 to 2026-11-30 17:41 UTC

count  status  tool           outcome             error_type         last (UTC)
-----  ------  -------------  ------------------  -----------------  -----------
    2     401  claude-code    http_error          authentication_e…  11-28 10:16
  - API key rejected: missing, expired or revoked, or with stray whitespace or a
    newline; keys seen: (none), k:9d41b7aa03c2 ((none): no key sent)
    1     403  claude-code    http_error          permission_error   11-30 12:00
  - the key works but may not do this (no access to the model, organisation,
    project or region); keys seen: k:7f3a9c1e5b20
    1     502  openai-python  proxy_error         proxy_error        11-29 15:06
  - llmtap itself failed on these requests: see the `llmtap serve` log, and
    report a bug
    1     200  cline          stream_truncated    -                  11-29 13:30
  - the upstream closed the stream before its terminal event (network drop or
    upstream crash): the client got a partial answer
    1     200  claude-code    client_disconnect…  -                  11-29 13:00
  - the client gave up before the end (its own timeout, or Ctrl-C): not an
    upstream failure
    1     504  codex          upstream_timeout    upstream_timeout   11-29 10:30
  - the upstream was silent longer than llmtap's timeout (overloaded?): retry,
    or raise `llmtap serve --connect-timeout/--idle-timeout`
    1     502  cline          upstream_unreacha…  upstream_unreach…  11-29 10:05
  - could not connect to llm.internal (DNS failure or connection refused): check
    the route's upstream URL, and HTTP_PROXY/HTTPS_PROXY/NO_PROXY
    1     529  claude-code    http_error          overloaded_error   11-29 09:40
  - upstream overloaded (HTTP 529): retry later with backoff; check the
    provider's status page
    1     500  codex          http_error          server_error       11-29 09:10
  - upstream failing (HTTP 500): retry later with backoff; check the provider's
    status page
    1     200  claude-code    stream_error        overloaded_error   11-29 08:31
  - the upstream sent an error event mid-stream (overloaded_error): the answer
    is cut short; the upstream is overloaded: retry later
    1     429  claude-code    http_error          rate_limit_error   11-29 08:31
  - rate limited (retry-after: 30 s): lower the request rate or concurrency, or
    raise the quota
    1     404  codex          http_error          invalid_request_…  11-28 16:45
  - unknown model gpt-5o: check the model id for typos, and that the key may use
    it
    1     404  cline          http_error          -                  11-28 14:26
  - path /local/chat/completions has no /v1: OpenAI-style clients append only
    /chat/completions or /responses, so their base URL must end in /v1
    1     404  claude-code    http_error          not_found_error    11-28 11:00
  - path /v1/v1/messages repeats /v1: the base URL already ends in /v1 and the
    client adds another: remove /v1 from the base URL

note: 1 successful stream had 2 chunks with empty `choices` (the usage chunk of
  `stream_options.include_usage`, or content-filter chunks): normal, but clients
  that read choices[0] unchecked break on them
"""


def test_errors_table(db: Path) -> None:
    output = run("errors", "--db", str(db))
    assert output == ERRORS
    assert max(len(line) for line in output.splitlines()) <= 80


def test_errors_csv_with_filters(db: Path) -> None:
    assert run("errors", "--db", str(db), "--tool", "codex", "--format", "csv") == """\
outcome,status,error_type,count,tool,last_seen,paths,models,keys,retry_after,messages,hosts,empty_choices_chunks,kinds,methods,causes
upstream_timeout,504,upstream_timeout,1,codex,2026-11-29 10:30,/openai/v1/responses,gpt-5,k:2b8d4e60aa17,,upstream api.openai.com did not answer in time (timed out),api.openai.com,0,generation,POST,"the upstream was silent longer than llmtap's timeout (overloaded?): retry, or raise `llmtap serve --connect-timeout/--idle-timeout`"
http_error,500,server_error,1,codex,2026-11-29 09:10,/openai/v1/responses,gpt-5,k:2b8d4e60aa17,,The server had an error while processing your request. Sorry about that!,api.openai.com,0,generation,POST,upstream failing (HTTP 500): retry later with backoff; check the provider's status page
http_error,404,invalid_request_error,1,codex,2026-11-28 16:45,/openai/v1/responses,gpt-5o,k:2b8d4e60aa17,,The model `gpt-5o` does not exist or you do not have access to it.,api.openai.com,0,generation,POST,"unknown model gpt-5o: check the model id for typos, and that the key may use it"
"""


def test_errors_json_in_a_window(db: Path) -> None:
    data = json.loads(run("errors", "--db", str(db), "--since", "2026-11-28", "--until", "2026-11-29",
                          "--format", "json"))
    assert (data["requests"], data["failed"], data["first"], data["last"]) == (
        10, 5, "2026-11-28 09:02", "2026-11-28 16:45")
    assert [(g["status"], g["error_type"], g["count"], g["tool"]) for g in data["groups"]] == [
        (401, "authentication_error", 2, "claude-code"), (404, "invalid_request_error", 1, "codex"),
        (404, None, 1, "cline"), (404, "not_found_error", 1, "claude-code")]
    auth = data["groups"][0]
    assert auth["keys"] == ["(none)", "k:9d41b7aa03c2"]
    assert auth["messages"] == ["invalid x-api-key", "x-api-key header is required"]
    assert auth["causes"] == [
        "API key rejected: missing, expired or revoked, or with stray whitespace or a newline;"
        " keys seen: (none), k:9d41b7aa03c2 ((none): no key sent)"]


def test_errors_when_nothing_failed(db: Path) -> None:
    assert run("errors", "--db", str(db), "--tag", "refactor", "--since", "2026-11-30") == (
        "0 failed of 3 requests (0.0%) from 2026-11-30 09:00 to 2026-11-30 09:03 UTC: nothing to diagnose\n")
    assert run("errors", "--db", str(db), "--since", "2030-01-01") == "no requests match\n"


def test_errors_fail_exits_1_only_when_something_failed(db: Path) -> None:
    failed = CliRunner().invoke(main, ["errors", "--db", str(db), "--fail", "--format", "json"])
    assert failed.exit_code == 1 and json.loads(failed.output)["failed"] == 15
    clean = CliRunner().invoke(main, ["errors", "--db", str(db), "--fail", "--tag", "refactor", "--since", "2026-11-30"])
    assert clean.exit_code == 0 and "nothing to diagnose" in clean.output
    assert CliRunner().invoke(main, ["errors", "--db", str(db)]).exit_code == 0  # without --fail: 0


async def test_a_failed_probe_is_worded_by_its_method_and_tool(tmp_path: Path) -> None:
    """Through the proxy to an upstream with no page at /: curl's `GET /` and Claude Code's `HEAD /` both
    404; `llmtap errors` calls only Claude Code's a warm-up, and names each by its own method and tool."""
    import aiohttp
    from aiohttp import web

    from .conftest import proxy_config
    from .serving import RunningProxy

    app = web.Application()
    async def not_found(_: web.Request) -> web.Response:
        return web.Response(status=404, text="Not Found")

    app.router.add_route("*", "/{tail:.*}", not_found)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        async with RunningProxy(proxy_config(f"http://127.0.0.1:{runner.addresses[0][1]}", tmp_path)) as proxy:
            async with aiohttp.ClientSession() as s:
                for method, agent in (("GET", "curl/8.5.0"), ("HEAD", "claude-cli/2.1.197 (external, cli)")):
                    async with s.request(method, proxy.url + "/", headers={"User-Agent": agent}) as r:
                        assert r.status == 404
            assert proxy.flush(10)
    finally:
        await runner.cleanup()
    shown = {g["tool"]: g for g in json.loads(run("errors", "--db", str(tmp_path / "llmtap.duckdb"), "--format", "json"))["groups"]}
    curl, claude = " ".join(shown["curl"]["causes"]), " ".join(shown["claude-code"]["causes"])
    assert curl.startswith("GET / from curl: a probe") and "warm-up" not in curl and "HEAD" not in curl
    assert claude.startswith("these are warm-up probes (HEAD /, as Claude Code sends")
