"""`llmtap setup`: the exact configuration printed, and --write merging into each tool's own file."""

from __future__ import annotations

import asyncio
import json
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from proxy.cli import main
from proxy.serve.server import write_state
from .serving import RunningProxy
from proxy.simulator.app import Simulator
from proxy.tools.cli import setup
from proxy.tools.toml_edit import set_keys

from .conftest import proxy_config
from .other_user import open_dir, other_user  # noqa: F401 (fixtures)

URL = "http://127.0.0.1:9911"


def invoke(home: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    clean = {"HOME": str(home), "CODEX_HOME": None, "CLAUDE_CONFIG_DIR": None, "CLINE_DATA_DIR": None,
             "CLINE_DIR": None, "CLINE_PROVIDER_SETTINGS_PATH": None}
    # the agents' own telemetry is tests/test_telemetry_setup.py's
    result = CliRunner().invoke(setup, [*args, "--no-telemetry"], env={**clean, **(env or {})})
    return result.exit_code, result.output


def backups(path: Path) -> list[Path]:
    return sorted(path.parent.glob(path.name + ".llmtap-backup-*"))


def test_commands_are_registered_on_llmtap() -> None:
    assert {"setup", "run", "doctor"} <= set(main.list_commands(None))


def test_claude_code_prints_env_block_without_v1(tmp_path: Path) -> None:
    code, out = invoke(tmp_path, "claude-code", "--base-url", URL + "/v1")
    assert code == 0
    assert out == (
        f"# {tmp_path}/.claude/settings.json\n"
        "{\n"
        '  "env": {\n'
        f'    "ANTHROPIC_BASE_URL": "{URL}"\n'
        "  }\n"
        "}\n"
        '# merged into the "env" object; ANTHROPIC_BASE_URL has no /v1 (Claude Code appends /v1/messages)\n'
        "# it applies however claude is started, and wins over the ANTHROPIC_BASE_URL variable\n"
        "# no key is set: a Claude subscription login keeps working (ANTHROPIC_API_KEY or ANTHROPIC_AUTH_TOKEN "
        "would replace it)\n"
        "# write it there with: llmtap setup claude-code --write\n"
    )
    assert not (tmp_path / ".claude").exists()


def test_sdks_print_their_variables(tmp_path: Path) -> None:
    code, out = invoke(tmp_path, "openai-sdk", "--base-url", URL)
    assert code == 0 and out.splitlines()[0] == f"export OPENAI_BASE_URL={URL}/v1"
    code, out = invoke(tmp_path, "anthropic-sdk", "--base-url", URL + "/")
    assert code == 0 and out.splitlines()[0] == f"export ANTHROPIC_BASE_URL={URL}"
    code, out = invoke(tmp_path, "openai-sdk", "--base-url", URL, "--write")
    assert code == 1 and "has no config file" in out


def test_claude_code_write_merges_backs_up_and_is_idempotent(tmp_path: Path) -> None:
    settings = tmp_path / ".claude" / "settings.json"
    settings.parent.mkdir()
    old = {"model": "opus", "env": {"FOO": "1", "ANTHROPIC_BASE_URL": "https://elsewhere"},
           "permissions": {"allow": ["Bash(ls)"]}}
    settings.write_text(json.dumps(old))
    code, out = invoke(tmp_path, "claude-code", "--base-url", URL, "--write")
    assert code == 0, out
    [backup] = backups(settings)
    assert out.splitlines()[-1] == f"wrote {settings} (owner-only backup: {backup})"
    assert json.loads(backup.read_text()) == old
    assert json.loads(settings.read_text()) == {
        "model": "opus", "env": {"FOO": "1", "ANTHROPIC_BASE_URL": URL}, "permissions": {"allow": ["Bash(ls)"]}}
    written = settings.read_bytes()
    code, out = invoke(tmp_path, "claude-code", "--base-url", URL, "--write")
    assert code == 0
    assert out.splitlines()[-1] == f"{settings} already has this configuration: nothing written"
    assert settings.read_bytes() == written and len(backups(settings)) == 1


def test_claude_config_dir_is_respected(tmp_path: Path) -> None:
    config_dir = tmp_path / "claude-config"
    code, out = invoke(tmp_path, "claude-code", "--base-url", URL, "--write",
                       env={"CLAUDE_CONFIG_DIR": str(config_dir)})
    assert code == 0, out
    assert out.splitlines()[-1] == f"wrote {config_dir / 'settings.json'} (new file, owner-only)"
    assert json.loads((config_dir / "settings.json").read_text()) == {"env": {"ANTHROPIC_BASE_URL": URL}}


def test_bad_json_is_left_alone(tmp_path: Path) -> None:
    settings = tmp_path / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_text("{not json")
    code, out = invoke(tmp_path, "claude-code", "--base-url", URL, "--write")
    assert code == 1 and "is not valid JSON" in out
    assert settings.read_text() == "{not json" and not backups(settings)


CODEX_BEFORE = """\
# my Codex settings
model = "gpt-5"   # the default
model_provider = "openai"

[analytics]
enabled = false

[model_providers.llmtap]
name = "old name"
base_url = "http://127.0.0.1:1/v1"
request_max_retries = 2   # keep me

# profiles below
[profiles.fast]
model = "gpt-5-mini"
"""

CODEX_AFTER = """\
# my Codex settings
model = "gpt-5"   # the default
model_provider = "llmtap"

[analytics]
enabled = false

[model_providers.llmtap]
name = "llmtap"
base_url = "http://127.0.0.1:9911/v1"
request_max_retries = 2   # keep me
env_key = "OPENAI_API_KEY"
wire_api = "responses"

# profiles below
[profiles.fast]
model = "gpt-5-mini"
"""


def test_codex_write_changes_only_its_lines(tmp_path: Path) -> None:
    codex_home = tmp_path / "codex-home"
    codex_home.mkdir()
    config = codex_home / "config.toml"
    config.write_text(CODEX_BEFORE)
    config.chmod(0o640)
    code, out = invoke(tmp_path, "codex", "--base-url", URL, "--write", env={"CODEX_HOME": str(codex_home)})
    assert code == 0, out
    assert config.read_text() == CODEX_AFTER
    assert oct(config.stat().st_mode & 0o777) == "0o640"
    [backup] = backups(config)
    assert backup.read_text() == CODEX_BEFORE
    code, out = invoke(tmp_path, "codex", "--base-url", URL, "--write", env={"CODEX_HOME": str(codex_home)})
    assert out.splitlines()[-1] == f"{config} already has this configuration: nothing written"
    assert config.read_text() == CODEX_AFTER and len(backups(config)) == 1


def test_codex_new_file_and_printed_snippet_agree(tmp_path: Path) -> None:
    code, out = invoke(tmp_path, "codex", "--base-url", URL, "--env-key", "TAP_KEY")
    snippet = "".join(line + "\n" for line in out.splitlines() if not line.startswith("#"))
    assert snippet == (
        'model_provider = "llmtap"\n\n[model_providers.llmtap]\nname = "llmtap"\n'
        f'base_url = "{URL}/v1"\nenv_key = "TAP_KEY"\nwire_api = "responses"\n'
    )
    code, out = invoke(tmp_path, "codex", "--base-url", URL, "--env-key", "TAP_KEY", "--write")
    assert code == 0, out
    assert (tmp_path / ".codex" / "config.toml").read_text() == snippet


def test_codex_inline_form_is_edited_in_its_form_and_bad_toml_refused_untouched(tmp_path: Path) -> None:
    config = tmp_path / ".codex" / "config.toml"
    config.parent.mkdir()
    config.write_text('model_providers = { llmtap = { name = "inline" } }  # mine\n')
    code, out = invoke(tmp_path, "codex", "--base-url", URL, "--write")
    assert code == 0, out
    text = config.read_text()
    assert text.startswith('model_providers = { llmtap = { name = "llmtap", base_url = ') and "# mine" in text
    assert tomllib.loads(text)["model_providers"]["llmtap"]["base_url"] == URL + "/v1"
    config.write_text("model = \n")
    code, out = invoke(tmp_path, "codex", "--base-url", URL, "--write")
    assert code == 1 and "is not valid TOML" in out and config.read_text() == "model = \n"


@pytest.mark.parametrize("text", [
    "", "# only a comment", "[a]\nx = 1", "# about a\n[a]\nx = [\n  [1, 2],\n]\n",
    'model_provider = "x"\r\n[model_providers.llmtap]\r\nname = "n"\r\n',
    "[model_providers.other]\nname = \"o\"\n[model_providers.llmtap]\n",
])
def test_toml_edit_keeps_the_document(text: str) -> None:
    values = {"name": "llmtap", "base_url": "http://h/v1"}
    result = set_keys(text, {"model_provider": "llmtap"}, ("model_providers", "llmtap"), values)
    expected = tomllib.loads(text)
    expected["model_provider"] = "llmtap"
    expected.setdefault("model_providers", {}).setdefault("llmtap", {}).update(values)
    assert tomllib.loads(result) == expected
    assert set_keys(result, {"model_provider": "llmtap"}, ("model_providers", "llmtap"), values) == result
    for line in text.splitlines():  # nothing of the old text is lost
        assert line.strip().startswith(("model_provider", "name")) or line in result


def test_toml_edit_keeps_a_dotted_key_definition() -> None:
    result = set_keys('model_providers.llmtap.name = "x"  # mine\n', {"model_provider": "llmtap"},
                      ("model_providers", "llmtap"), {"name": "llmtap"})
    assert result.startswith('model_providers.llmtap.name = "llmtap"  # mine\n')
    assert tomllib.loads(result) == {"model_provider": "llmtap", "model_providers": {"llmtap": {"name": "llmtap"}}}


def test_cline_write_keeps_keys_and_models(tmp_path: Path) -> None:
    data_dir = tmp_path / "cline-data"
    providers = data_dir / "settings" / "providers.json"
    providers.parent.mkdir(parents=True)
    old = {"version": 1, "lastUsedProvider": "openai-compatible", "modes": {}, "providers": {
        "openai-compatible": {"settings": {"provider": "openai-compatible", "apiKey": "sk-keep", "model": "m",
                                           "baseUrl": "http://old/v1"},
                              "updatedAt": "2026-01-01T00:00:00.000Z", "tokenSource": "manual"},
        "cline": {"settings": {"provider": "cline"}, "updatedAt": "2026-01-01T00:00:00.000Z"}}}
    providers.write_text(json.dumps(old))
    providers.chmod(0o600)
    code, out = invoke(tmp_path, "cline", "--base-url", URL, "--write", "--data-dir", str(data_dir))
    assert code == 0, out
    new = json.loads(providers.read_text())
    assert new["lastUsedProvider"] == "openai-compatible" and new["providers"]["cline"] == old["providers"]["cline"]
    compat = new["providers"]["openai-compatible"]
    assert compat["settings"] == {"provider": "openai-compatible", "apiKey": "sk-keep", "model": "m",
                                  "baseUrl": URL + "/v1"}
    assert compat["updatedAt"] != "2026-01-01T00:00:00.000Z" and compat["tokenSource"] == "manual"
    for name in ("anthropic", "openai-native"):
        entry = new["providers"][name]
        assert entry["settings"] == {"provider": name, "baseUrl": URL + "/v1"}
        assert entry["updatedAt"].endswith("Z") and entry["tokenSource"] == "manual"
    assert oct(providers.stat().st_mode & 0o777) == "0o600"
    written = providers.read_bytes()
    code, out = invoke(tmp_path, "cline", "--base-url", URL, "--write", "--data-dir", str(data_dir))
    assert "nothing written" in out and providers.read_bytes() == written and len(backups(providers)) == 1


def test_cline_data_dir_variable_is_respected(tmp_path: Path) -> None:
    code, out = invoke(tmp_path, "cline", "--base-url", URL, "--write", env={"CLINE_DATA_DIR": str(tmp_path / "d")})
    assert code == 0, out
    assert (tmp_path / "d" / "settings" / "providers.json").exists()
    code, out = invoke(tmp_path, "cline", "--base-url", URL)
    assert out.splitlines()[0] == f"# {tmp_path}/.cline/data/settings/providers.json"


async def test_default_base_url_is_the_running_proxy(sim: Simulator, tmp_path: Path) -> None:
    async with RunningProxy(proxy_config(sim.url, tmp_path)) as proxy:
        write_state(proxy)
        code, out = await asyncio.to_thread(invoke, tmp_path, "openai-sdk")
    assert code == 0
    assert out.splitlines()[0] == f"export OPENAI_BASE_URL={proxy.url}/v1"
    code, out = invoke(tmp_path, "openai-sdk")  # serve.json names a proxy that no longer answers
    assert out.splitlines()[0] == "export OPENAI_BASE_URL=http://127.0.0.1:8787/v1"


async def test_where_the_proxy_injects_the_key_each_tool_gets_the_client_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`setup` gives each tool llmtap's client key; a request made the way the tool makes it then
    passes the proxy's check, and the real key reaches the upstream."""
    import aiohttp

    from proxy.settings.client_key import client_key

    from .upstreams import Script, ScriptedUpstream

    monkeypatch.setenv("REAL_KEY", "sk-real-upstream-key-for-setup-0123456789")
    async with ScriptedUpstream(Script(chunks=[b"{}"])) as up:
        async with RunningProxy(proxy_config(up.url, tmp_path, upstream_key_env="REAL_KEY")) as proxy:
            write_state(proxy)
            key = client_key()
            outputs = {tool: await asyncio.to_thread(invoke, tmp_path, tool, "--write")
                       for tool in ("claude-code", "codex", "cline")}
            code, sdk = await asyncio.to_thread(invoke, tmp_path, "openai-sdk")
            code2, anthropic_sdk = await asyncio.to_thread(invoke, tmp_path, "anthropic-sdk")
            claude = json.loads((tmp_path / ".claude" / "settings.json").read_text())["env"]
            codex = tomllib.loads((tmp_path / ".codex" / "config.toml").read_text())["model_providers"]["llmtap"]
            cline = json.loads((tmp_path / ".cline" / "data" / "settings" / "providers.json").read_text())
            sent = [("/v1/messages", {"Authorization": f"Bearer {claude['ANTHROPIC_AUTH_TOKEN']}"}),
                    ("/v1/responses", {"Authorization": f"Bearer {codex['experimental_bearer_token']}"}),
                    ("/v1/chat/completions",
                     {"Authorization": f"Bearer {cline['providers']['openai-compatible']['settings']['apiKey']}"}),
                    ("/v1/messages", {"x-api-key": cline["providers"]["anthropic"]["settings"]["apiKey"]})]
            async with aiohttp.ClientSession() as s:
                for path, headers in sent:
                    async with s.post(proxy.url + path, data=b"{}", headers=headers) as r:
                        assert r.status == 200, (path, await r.text())
    assert all(code == 0 for code, _ in outputs.values()), outputs
    assert "ANTHROPIC_AUTH_TOKEN is llmtap's client key" in outputs["claude-code"][1]
    assert "env_key" not in codex and codex["base_url"] == f"{proxy.url}/v1"
    assert (code, code2) == (0, 0)
    assert f"export OPENAI_API_KEY={key}" in sdk.splitlines() and f"export ANTHROPIC_API_KEY={key}" in anthropic_sdk
    assert len(up.received) == 4 and all("sk-real-upstream-key" in str(r.headers) for r in up.received)
    assert all(key not in str(r.headers) for r in up.received)


@pytest.mark.parametrize("tool", ["claude-code", "codex", "cline"])
def test_a_config_given_the_client_key_is_owner_only_and_so_are_its_backups(
        tool: str, other_user, open_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second Unix user could read settings.json (0644, as Claude Code leaves it) once setup had
    written llmtap's client key into it, and sent that key through the proxy. Now the file and its
    backup are 0600, and the output says which file was tightened."""
    from proxy.settings.client_key import client_key

    from .other_user import can_read

    config = tmp_path / "config.toml"
    config.write_text('upstream_key_env = "REAL_KEY"\n')
    monkeypatch.setenv("LLMTAP_CONFIG", str(config))
    files = {"claude-code": (open_dir / ".claude" / "settings.json", '{"model": "opus"}\n'),
             "codex": (open_dir / ".codex" / "config.toml", 'model = "gpt-5"\n'),
             "cline": (open_dir / ".cline" / "data" / "settings" / "providers.json", '{"version": 1}\n')}
    path, old = files[tool]
    path.parent.mkdir(parents=True)
    path.write_text(old)
    path.chmod(0o644)
    earlier = path.with_name(path.name + ".llmtap-backup-20260101T000000Z")  # an earlier run's
    earlier.write_text(old)
    earlier.chmod(0o644)
    assert can_read(other_user, path)  # the other user reaches it: only the mode can stop them
    code, out = invoke(open_dir, tool, "--base-url", URL, "--write")
    assert code == 0, out
    assert client_key() in path.read_text()
    new_backup = next(b for b in backups(path) if b != earlier)
    for f in (path, new_backup, earlier):
        assert f.stat().st_mode & 0o777 == 0o600, f
        assert not can_read(other_user, f), f
    assert f"{path} was readable by others (0644): now 0600, owner-only, as it holds llmtap's client key" in out
    assert f"{earlier} was readable by others (0644)" in out
    path.chmod(0o644)  # unchanged content: nothing written, but still made owner-only
    code, out = invoke(open_dir, tool, "--base-url", URL, "--write")
    assert "nothing written" in out and path.stat().st_mode & 0o777 == 0o600


AGENT_FILES = {  # what `setup TOOL --write` leaves in a home without them
    "gemini-cli": {".gemini/.env": f"GOOGLE_GEMINI_BASE_URL={URL}\n",
                   ".gemini/settings.json": {"security": {"auth": {"selectedType": "gemini-api-key"}}}},
    "opencode": {".config/opencode/opencode.json": {"provider": {"anthropic": {"options": {"baseURL": URL + "/v1"}},
                                                                 "openai": {"options": {"baseURL": URL + "/v1"}}}}},
    "qwen-code": {".qwen/.env": f"OPENAI_BASE_URL={URL}/v1\n",
                  ".qwen/settings.json": {"security": {"auth": {"selectedType": "openai"}}}},
    "aider": {".aider.conf.yml": f'openai-api-base: "{URL}/v1"\n'},
}


@pytest.mark.parametrize("tool", AGENT_FILES)
def test_the_agents_print_then_write_their_files(tmp_path: Path, tool: str) -> None:
    code, out = invoke(tmp_path, tool, "--base-url", URL + "/v1", env={"XDG_CONFIG_HOME": None})
    assert code == 0 and out.endswith(f"# write it there with: llmtap setup {tool} --write\n"), out
    assert not any((tmp_path / name).exists() for name in AGENT_FILES[tool])
    code, out = invoke(tmp_path, tool, "--base-url", URL, "--write", env={"XDG_CONFIG_HOME": None})
    assert code == 0, out
    for name, expected in AGENT_FILES[tool].items():
        path = tmp_path / name
        assert f"wrote {path} (new file, owner-only)" in out
        assert (json.loads(path.read_text()) if isinstance(expected, dict) else path.read_text()) == expected
    code, out = invoke(tmp_path, tool, "--base-url", URL, "--write", env={"XDG_CONFIG_HOME": None})
    assert code == 0 and out.count("already has this configuration: nothing written") == len(AGENT_FILES[tool])


def test_the_agents_logins_and_other_lines_are_kept(tmp_path: Path) -> None:
    """A Google login's selectedType stays; a .env's other lines and the key stay; the old line is replaced;
    a backup is made of each changed file."""
    gemini = tmp_path / ".gemini"
    gemini.mkdir()
    (gemini / "settings.json").write_text(json.dumps({"security": {"auth": {"selectedType": "oauth-personal"}}}))
    (gemini / ".env").write_text("GEMINI_API_KEY=AIza-mine\nexport GOOGLE_GEMINI_BASE_URL=http://old\n")
    code, out = invoke(tmp_path, "gemini-cli", "--base-url", URL, "--write")
    assert code == 0, out
    assert json.loads((gemini / "settings.json").read_text())["security"]["auth"]["selectedType"] == "oauth-personal"
    assert "settings.json already has this configuration" in out
    assert (gemini / ".env").read_text() == f"GEMINI_API_KEY=AIza-mine\nGOOGLE_GEMINI_BASE_URL={URL}\n"
    [backup] = backups(gemini / ".env")
    assert "http://old" in backup.read_text() and backup.stat().st_mode & 0o777 == 0o600
    (tmp_path / ".aider.conf.yml").write_text("model: openai/m\nopenai-api-base: http://old/v1\n")
    code, out = invoke(tmp_path, "aider", "--base-url", URL, "--write")
    assert (tmp_path / ".aider.conf.yml").read_text() == f'model: openai/m\nopenai-api-base: "{URL}/v1"\n'
