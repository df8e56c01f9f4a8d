"""A request's kind: decided in the proxy from method, path, body and headers, and stored in its row."""

from __future__ import annotations

import duckdb
import orjson
import pytest

from proxy.meter.request_info import parse_request
from proxy.meter.request_kind import path_kind, path_kind_sql, request_kind
from proxy.common.schema import KINDS
from .serving import RunningProxy
from proxy.simulator.app import Simulator

from .cli_traffic import daily_mix
from .conftest import rows

PATHS = [  # (method, path, kind by method and path alone)
    ("POST", "/v1/chat/completions", "generation"),
    ("POST", "/openrouter/api/v1/chat/completions/", "generation"),
    ("POST", "/v1/completions", "generation"),
    ("POST", "/v1/messages?beta=true", "generation"),
    ("POST", "/v1/responses", "generation"),
    ("POST", "/backend-api/codex/responses", "generation"),
    ("POST", "/v1beta/models/gemini-2.5-pro:streamGenerateContent", "generation"),
    ("POST", "/v1beta/models/gemini-2.5-pro%3AgenerateContent", "generation"),
    ("POST", "/v1/messages/count_tokens?beta=true", "token_count"),
    ("POST", "/v1/responses/input_tokens", "token_count"),
    ("POST", "/v1beta/models/gemini-2.5-pro:countTokens", "token_count"),
    ("POST", "/v1/embeddings", "embedding"),
    ("POST", "/v1beta/models/text-embedding-004:embedContent", "embedding"),
    ("POST", "/v1beta/models/text-embedding-004:batchEmbedContents", "embedding"),
    ("GET", "/v1/models", "model_list"),
    ("GET", "/v1/models/gpt-5", "model_list"),
    ("GET", "/v1beta/models", "model_list"),
    ("HEAD", "/", "probe"),
    ("HEAD", "/anthropic", "probe"),
    ("OPTIONS", "/v1/chat/completions", "probe"),
    ("GET", "/", "probe"),
    ("GET", "/v1/responses", "other"),  # a WebSocket handshake without a turn (refused)
    ("GET", "/v1/responses/resp_123", "other"),
    ("POST", "/v1/responses/compact", "other"),
    ("GET", "/v1/messages", "other"),
    ("POST", "/v1/audio/transcriptions", "other"),
]


@pytest.mark.parametrize(("method", "path", "kind"), PATHS)
def test_kind_by_method_and_path(method: str, path: str, kind: str) -> None:
    assert path_kind(method, path) == kind
    assert kind in KINDS


def test_the_sql_expression_agrees_with_python() -> None:
    con = duckdb.connect()
    con.execute("CREATE TABLE r (method VARCHAR, path VARCHAR, status INTEGER)")
    con.executemany("INSERT INTO r VALUES (?, ?, 200)", [(m, p) for m, p, _ in PATHS])
    got = con.execute(f"SELECT method, path, {path_kind_sql()} FROM r").fetchall()
    assert got == [(m, p, k) for m, p, k in PATHS]
    (ws,) = con.execute(f"SELECT {path_kind_sql(status='101')} FROM r WHERE method = 'GET' AND path = '/v1/responses'"
                        ).fetchone()
    assert ws == "generation"  # a WebSocket response recorded before the column existed


def frame(**fields: object) -> bytes:
    return orjson.dumps({"type": "response.create", "model": "gpt-5-codex", **fields})


@pytest.mark.parametrize(("body", "kind"), [
    (frame(input=[]), "generation"),
    (frame(input=[], generate=False), "prewarm"),
    (frame(response={"generate": False}), "prewarm"),
    (frame(generate=True), "generation"),
])
def test_websocket_frames(body: bytes, kind: str) -> None:
    assert parse_request("/v1/responses", {"Upgrade": "websocket"}, body, method="GET").kind == kind


def test_codex_says_it_in_its_header() -> None:
    said = {"x-codex-turn-metadata": '{"request_kind":"turn","turn_id":"t"}'}
    assert request_kind("POST", "/v1/some/new/endpoint", said.get, None) == "generation"
    prewarm = {"x-codex-turn-metadata": '{"request_kind":"prewarm"}'}
    assert request_kind("POST", "/v1/responses", prewarm.get, {}) == "prewarm"
    broken = {"x-codex-turn-metadata": "{request_kind"}
    assert request_kind("POST", "/v1/responses", broken.get, {}) == "generation"
    # a token count stays one whatever the header says
    assert request_kind("POST", "/v1/responses/input_tokens", said.get, {}) == "token_count"


async def test_every_kind_the_real_clis_send_is_recorded(sim: Simulator, proxy: RunningProxy) -> None:
    await daily_mix(proxy.url, rounds=1)
    recorded = rows(proxy)
    kinds = sorted((r["method"], r["path"], r["kind"]) for r in recorded)
    assert kinds == sorted([
        ("HEAD", "/", "probe"),
        ("POST", "/v1/messages/count_tokens", "token_count"),
        ("POST", "/v1/messages", "generation"),
        ("GET", "/v1/responses", "prewarm"),
        ("GET", "/v1/responses", "generation"),
        ("POST", "/v1/chat/completions", "generation"),
        ("GET", "/v1/models", "model_list"),
    ])
    turn = next(r for r in recorded if r["method"] == "GET" and r["kind"] == "generation")
    # the wire streamed: a WebSocket response is a stream though its frame has no `stream` field
    assert turn["stream"] is True and turn["ttft_ms"] is not None and turn["status"] == 101
    prewarm = next(r for r in recorded if r["kind"] == "prewarm")
    assert prewarm["output_tokens"] in (None, 0) and prewarm["outcome"] == "ok"


def test_the_views_keep_a_stored_kind_and_derive_a_missing_one(tmp_path) -> None:
    from analysis.views import create_views
    from proxy.common.schema import create_tables_sql

    def kinds(rows: list[tuple[str, str, int, str | None]]) -> list[str]:
        path = tmp_path / f"k{len(rows)}.duckdb"
        con = duckdb.connect(str(path))
        con.execute(create_tables_sql())
        con.executemany("INSERT INTO requests (id, method, path, status, kind) VALUES (?, ?, ?, ?, ?)",
                        [(str(i), *row) for i, row in enumerate(rows)])
        con.close()
        con = duckdb.connect(str(path), read_only=True)
        create_views(con)
        found = [k for (k,) in con.execute("SELECT kind FROM requests ORDER BY id").fetchall()]
        con.close()
        return found

    # a prewarm's path says generation: the stored kind wins; a row without one gets its path's
    assert kinds([("GET", "/v1/responses", 101, "prewarm"), ("HEAD", "/", 404, None)]) == ["prewarm", "probe"]
    assert kinds([("GET", "/v1/responses", 101, "prewarm")]) == ["prewarm"]
