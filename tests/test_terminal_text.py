"""Stored data reaches the terminal as text, never as control sequences (proxy/common/terminal_text.py).

An upstream's error message and a `/_tag/` path sent without the client key (answered 401) are
stored as sent; every command that prints them shows their controls escaped, and `--format json`
gives the exact values back."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import pty
import select
import subprocess
import sys
import urllib.parse
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from analysis.top.render import Column, table
from analysis.top.terminal import paint
from proxy.relay.app import CLIENT_KEY_NEEDED
from proxy.cli import main
from .serving import RunningProxy
from proxy.common.terminal_text import printable

from .conftest import proxy_config, rows
from .faultkit import raw_exchange, status_of
from .upstreams import Script, ScriptedUpstream

ROOT = Path(__file__).resolve().parent.parent
# Every kind of sequence a terminal acts on: OSC 52 (writes the clipboard), CSI, DCS, APC, PM, SOS,
# 8-bit CSI and NEL as UTF-8 (U+009B, U+0085), a lone ESC, BEL, BS, DEL, CR and LF.
HOSTILE = ("osc\x1b]52;c;aGk=\x07 csi\x1b[2J dcs\x1bP1$r\x1b\\ apc\x1b_a\x1b\\ pm\x1b^p\x1b\\ sos\x1bXs\x1b\\ "
           "c1\u009b2J\u0085\u009d lone\x1b bel\x07 bs\x08 del\x7f cr\rforged lf\nforged end")
TAG = "t\x1b]52;c;aGk=\x07\u009b1m"
MODEL = "m\x1b]0;title\x07\u0085"


def terminal_controls(text: str) -> list[str]:
    """What a terminal would act on in `text`: C0 controls but line breaks and tabs, DEL, C1."""
    return [c for c in text if (ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F]


def test_printable_escapes_every_control_the_json_way() -> None:
    every = "".join(map(chr, [*range(0x20), *range(0x7F, 0xA0)]))
    shown = printable(every)
    assert terminal_controls(shown) == [] and "\n" not in shown and "\t" not in shown
    assert json.loads(f'"{shown}"') == every  # the escapes are JSON's: the value can be read back
    assert printable("a\tb\nc\x1b", layout=True) == "a\tb\nc\\u001b"
    assert printable("plain text, ünïcode ✓") == "plain text, ünïcode ✓"
    as_json = orjson.dumps({"v": HOSTILE}).decode()  # orjson leaves DEL and C1 raw
    assert json.loads(printable(as_json, layout=True)) == {"v": HOSTILE}


@pytest.fixture(scope="module")
def hostile_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database with what anyone can store: an upstream's error message and model name, and a tag
    sent on a 401 (no client key for a route that injects the upstream key)."""
    tmp = tmp_path_factory.mktemp("hostile")

    async def record() -> None:
        error = orjson.dumps({"error": {"type": "invalid_request_error", "message": HOSTILE}})
        script = Script(status=400, headers=[("Content-Type", "application/json")], chunks=[error])
        async with ScriptedUpstream(script) as up:
            config = proxy_config(up.url, tmp, routes={"/p": up.url}, route_key_env={"/p": "HOME"})
            async with RunningProxy(config) as p:
                body = orjson.dumps({"model": MODEL, "messages": []})
                tag = urllib.parse.quote(TAG, safe="")
                for target, key in (("/p/v1/chat/completions", p.state.client_key),
                                    (f"/_tag/{tag}/p/v1/chat/completions", "not-the-client-key")):
                    head = (f"POST {target} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {key}\r\n"
                            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                            "Connection: close\r\n\r\n").encode()
                    assert status_of(await raw_exchange(p.port, head + body)) in (400, 401)
                found = rows(p, "SELECT status, tag, error_message FROM requests ORDER BY status")
        assert [(r["status"], r["tag"]) for r in found] == [(400, None), (401, TAG)]
        assert found[0]["error_message"] == HOSTILE  # stored as sent

    with pytest.MonkeyPatch.context() as env:  # the autouse home comes after a module's fixtures
        env.setenv("LLMTAP_HOME", str(tmp / "home"))
        env.setenv("LLMTAP_CONFIG", str(tmp / "no-config.toml"))
        asyncio.run(record())
    return tmp / "llmtap.duckdb"


COMMANDS = [
    ["errors"], ["errors", "--format", "csv"],
    ["report", "--by", "tag"], ["report", "--by", "model"], ["report", "--by", "tag", "--format", "csv"],
    *(["sql", "SELECT * FROM requests", "--format", f] for f in ("table", "csv", "markdown")),
    ["sql", "SELECT error_message::INTEGER FROM requests"],  # DuckDB's error quotes the value
]


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_no_command_sends_stored_controls_to_the_terminal(hostile_db: Path, args: list[str]) -> None:
    # color=True: as on a terminal, where click strips nothing (it strips CSI only off a terminal)
    result = CliRunner().invoke(main, [*args, "--db", str(hostile_db)], color=True)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert terminal_controls(result.output) == [], result.output
    assert "\\u001b]" in result.output  # shown, as text


def test_on_a_real_terminal_nothing_stored_reaches_it(hostile_db: Path) -> None:
    """`llmtap errors` in its own process with a pseudo-terminal for stdout, as a user runs it."""
    leader, follower = pty.openpty()
    try:
        proc = subprocess.run([sys.executable, "-m", "proxy", "errors", "--db", str(hostile_db)], stdout=follower,
                              stderr=subprocess.PIPE, timeout=60, env={**os.environ, "TERM": "xterm"})
        os.close(follower)
        out = b""
        while select.select([leader], [], [], 1)[0]:
            try:
                piece = os.read(leader, 65536)
            except OSError:  # the follower closed: all read
                break
            if not piece:
                break
            out += piece
    finally:
        os.close(leader)
    assert proc.returncode == 0, proc.stderr
    text = out.decode().replace("\r\n", "\n")  # the terminal's own line ending
    assert "\\u001b]52;c;aGk=\\u0007" in text and terminal_controls(text) == [], text


def test_show_prints_each_value_on_its_own_line_escaped(hostile_db: Path) -> None:
    ids = CliRunner().invoke(main, ["sql", "SELECT id FROM requests ORDER BY status", "--format", "json",
                                    "--db", str(hostile_db)]).output
    for entry in json.loads(ids):
        shown = CliRunner().invoke(main, ["show", entry["id"][:12], "--db", str(hostile_db)], color=True).output
        assert terminal_controls(shown) == [], shown
        assert not [line for line in shown.splitlines() if line.startswith("forged")], shown


@pytest.mark.parametrize("fmt", ["json", "ndjson"])
def test_json_output_is_escaped_and_gives_the_exact_values(hostile_db: Path, fmt: str) -> None:
    result = CliRunner().invoke(main, ["sql", "SELECT tag, error_message, request_model FROM requests ORDER BY status",
                                       "--format", fmt, "--db", str(hostile_db)], color=True)
    assert terminal_controls(result.output) == [], result.output
    got = json.loads(result.output) if fmt == "json" else [json.loads(line) for line in result.output.splitlines()]
    assert got == [{"tag": None, "error_message": HOSTILE, "request_model": MODEL},
                   {"tag": TAG, "error_message": CLIENT_KEY_NEEDED, "request_model": None}]  # (a 401's body: unread)


def test_top_frames_show_stored_controls_as_text() -> None:
    section = table("model", [Column("tool", 12, False)], [(MODEL, [TAG])], width=80)
    painted = paint([section.heading, *section.rows])
    own = painted.replace("\x1b[H", "").replace("\x1b[K", "").replace("\x1b[J", "").replace("\x1b[7m", "")
    own = own.replace("\x1b[0m", "").replace("\r\n", "")
    assert terminal_controls(own) == [] and "m\\u001b]0;title\\u0007\\u0085" in painted


# -- the single path -------------------------------------------------------------------------------------


def _writes_around(tree: ast.AST) -> list[int]:
    """Lines of `print(...)`, `click.echo`/`secho(...)`, `sys.stdout/stderr.write(...)` calls."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id == "print":
            found.append(node.lineno)
        elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and (
                (f.value.id == "click" and f.attr in ("echo", "secho"))):
            found.append(node.lineno)
        elif (isinstance(f, ast.Attribute) and f.attr == "write" and isinstance(f.value, ast.Attribute)
              and isinstance(f.value.value, ast.Name) and f.value.value.id == "sys"):
            found.append(node.lineno)
    return found


def test_every_text_for_the_terminal_leaves_through_terminal_text() -> None:
    """No module writes to stdout or stderr but proxy/common/terminal_text.py (`echo`, `stderr_line`)."""
    own = ROOT / "proxy" / "common" / "terminal_text.py"
    found = [f"{path.relative_to(ROOT)}:{line}"
             for package in ("proxy", "analysis") for path in sorted((ROOT / package).rglob("*.py")) if path != own
             for line in _writes_around(ast.parse(path.read_text()))]
    assert found == []
