import gzip
import zlib

import brotli
import orjson
import pytest
from backports import zstd

from proxy.meter.request_info import BodyTooLarge, RequestInfo, decode_body, parse_request

CLAUDE_SESSION = "3f0e0f6a-9a53-4a51-9a5d-1c2b3c4d5e6f"

CLAUDE_BODY = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 32000,
    "stream": True,
    "thinking": {"type": "adaptive"},
    "messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "say hi"}],
    "tools": [{"name": "Bash", "description": "Run a command.", "input_schema": {"type": "object"}}],
    "metadata": {"user_id": orjson.dumps({"device_id": "d" * 64, "account_uuid": "", "session_id": CLAUDE_SESSION}).decode()},
}


def test_claude_code_request():
    headers = {"Content-Type": "application/json", "User-Agent": "claude-cli/2.1.197 (external, sdk-cli)"}
    info = parse_request("/v1/messages?beta=true", headers, orjson.dumps(CLAUDE_BODY))
    assert info == RequestInfo("claude-sonnet-4-5", True, 32000, 2, CLAUDE_SESSION, None, "generation")


def test_session_header_wins_and_is_case_insensitive():
    headers = {"X-Claude-Code-Session-Id": "from-header"}
    assert parse_request("/v1/messages", headers, orjson.dumps(CLAUDE_BODY)).session_id == "from-header"
    for name in ("session-id", "Session_Id", "X-Session-Id"):
        assert parse_request("/v1/responses", {name: "s1"}, b"").session_id == "s1"


@pytest.mark.parametrize(("user_id", "session"), [
    (f"user_{'a' * 64}_account_{CLAUDE_SESSION}_session_{CLAUDE_SESSION}", CLAUDE_SESSION),
    ("plain-user", "plain-user"),
    ('{"device_id": "d"}', None),
    ("", None),
])
def test_metadata_user_id(user_id, session):
    body = orjson.dumps({"model": "m", "messages": [], "metadata": {"user_id": user_id}})
    assert parse_request("/v1/messages", {}, body).session_id == session


def test_codex_zstd_request():
    body = {"model": "gpt-5", "stream": True, "input": [{"type": "message"}] * 3, "max_output_tokens": 4000}
    headers = {"content-encoding": "zstd", "content-type": "application/json", "session-id": "codex-1"}
    info = parse_request("/v1/responses", headers, zstd.compress(orjson.dumps(body)))
    assert info == RequestInfo("gpt-5", True, 4000, 3, "codex-1", None, "generation")


def raw_deflate(data: bytes) -> bytes:
    """Deflate without the zlib wrapper, as some clients send it."""
    compressor = zlib.compressobj(wbits=-15)
    return compressor.compress(data) + compressor.flush()


@pytest.mark.parametrize(("encoding", "compress"), [
    ("gzip", gzip.compress),
    ("deflate", zlib.compress),
    ("deflate", raw_deflate),
    ("br", brotli.compress),
    ("zstd", zstd.compress),
    ("gzip, br", lambda b: brotli.compress(gzip.compress(b))),
    ("identity", lambda b: b),
])
def test_compressed_bodies(encoding, compress):
    body = orjson.dumps({"model": "m", "messages": [1, 2, 3], "max_completion_tokens": 9})
    info = parse_request("/v1/chat/completions", {"Content-Encoding": encoding}, compress(body))
    assert info == RequestInfo("m", False, 9, 3, None, None, "generation")


@pytest.mark.parametrize(("encoding", "compress"), [
    ("gzip", gzip.compress), ("deflate", zlib.compress), ("br", brotli.compress), ("zstd", zstd.compress)])
def test_decoding_is_bounded(encoding, compress):
    bomb = compress(b"\0" * 100_000)
    assert decode_body(bomb, encoding, limit=100_000) == b"\0" * 100_000
    with pytest.raises(BodyTooLarge):
        decode_body(bomb, encoding, limit=99_999)


@pytest.mark.parametrize(("encoding", "body"), [("gzip", b"not gzip"), ("zstd", b"\x28\xb5\x2f\xfd"), ("compress", b"x")])
def test_undecodable_body_is_a_parse_error(encoding, body):
    info = parse_request("/v1/chat/completions", {"content-encoding": encoding}, body)
    assert info.request_parse_error.startswith(f"content-encoding {encoding}")


def test_gemini_model_and_stream_from_path():
    body = orjson.dumps({"contents": [{"role": "user"}] * 2, "generationConfig": {"maxOutputTokens": 256}})
    info = parse_request("/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse&key=k", {}, body)
    assert info == RequestInfo("gemini-2.5-pro", True, 256, 2, None, None, "generation")
    info = parse_request("/gemini/v1beta/models/gemini-2.5-flash:generateContent", {}, body)
    assert (info.request_model, info.stream) == ("gemini-2.5-flash", False)


def test_responses_string_input_and_default_stream():
    info = parse_request("/v1/responses", {}, b'{"model": "gpt-5", "input": "hi"}')
    assert info == RequestInfo("gpt-5", False, None, 1, None, None, "generation")


@pytest.mark.parametrize(("path", "headers", "body", "method", "error"), [
    ("/v1/models", {}, b"", "GET", False),
    ("/", {}, b"", "HEAD", False),
    ("/v1/models", {}, b"garbage", "GET", False),
    ("/v1/audio/transcriptions", {"content-type": "multipart/form-data; boundary=x"}, b"--x\r\n", "POST", False),
    ("/v1/chat/completions", {}, b"{not json", "POST", True),
    ("/v1/chat/completions", {}, b"{not json", None, True),
    ("/v1/messages", {"Content-Type": "application/json"}, b"\xff\xfe", "PUT", True),
    ("/v1/messages", {"Content-Type": "application/json"}, b'{"model": 5, "messages": {}, "stream": "yes"}', "POST", False),
])
def test_parse_errors(path, headers, body, method, error):
    info = parse_request(path, headers, body, method=method)
    assert (info.request_parse_error is not None) == error


def test_wrong_types_are_ignored():
    body = b'{"model": 5, "messages": {}, "stream": "yes", "max_tokens": "9", "metadata": []}'
    assert parse_request("/v1/messages", {}, body) == RequestInfo(None, False, None, None, None, None, "generation")


def test_json_that_is_not_an_object():
    assert parse_request("/v1/chat/completions", {}, b"[1, 2]") == RequestInfo(kind="generation")


def test_the_project_is_the_working_directory_the_tool_states_in_its_own_places() -> None:
    from proxy.meter.request_info import project_of

    env = "<env>\nWorking directory: /home/me/src/shop/\nIs directory a git repo: No\n</env>"
    assert project_of({"system": [{"type": "text", "text": "x"}, {"type": "text", "text": env}]}) == "shop"
    assert project_of({"system": "Primary working directory: /a/b/llmtap"}) == "llmtap"
    assert project_of({"messages": [{"role": "system", "content": "4. Working Directory: C:\\Users\\me\\proj"}]}) == "proj"
    assert project_of({"input": [{"role": "developer", "content": "Working Directory: /x/cline-proj"}]}) == "cline-proj"
    codex = "<environment_context>\n  <cwd>/srv/api</cwd>\n</environment_context>"
    assert project_of({"input": [{"role": "user", "content": [{"type": "input_text", "text": codex}]}]}) == "api"
    assert project_of({"system": "Working directory: /"}) == "/"
    # a user's message, a tool result or a file's text is never the project
    assert project_of({"messages": [{"role": "user", "content": "Working directory: /etc"}]}) is None
    assert project_of({"input": [{"role": "user", "content": "<cwd>/etc</cwd>"}]}) is None
    assert project_of({"system": "Working directory: /" + "a" * 500})  == "a" * 200  # bounded
