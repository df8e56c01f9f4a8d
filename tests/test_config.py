"""Routes and the serve configuration: defaults < config file < flags."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from proxy.cli import main
from proxy.settings.config import ConfigError, ServeConfig, build
from proxy.settings.routes import RouteTable, make_route, parse_route


def test_upstream_path_is_kept_and_request_path_appended() -> None:
    route = make_route("", "https://taotoken.net/api/")
    assert str(route.target("/v1/chat/completions", "")) == "https://taotoken.net/api/v1/chat/completions"


def test_longest_prefix_wins_and_is_stripped() -> None:
    table = RouteTable([make_route("", "http://default"), make_route("/a", "http://a"), make_route("/a/b", "http://ab/x")])
    route = table.match("/a/b/v1/messages")
    assert route is not None and route.prefix == "/a/b"
    assert str(route.target("/a/b/v1/messages", "beta=true")) == "http://ab/x/v1/messages?beta=true"
    assert table.match("/ab/v1").prefix == ""  # type: ignore[union-attr]  # not a path-segment match
    assert RouteTable([make_route("/a", "http://a")]).match("/other") is None


@pytest.mark.parametrize("spec", ["no-equals", "/x=ftp://host", "/x=not a url", "/x=http://h/?q=1"])
def test_bad_routes_are_explained(spec: str) -> None:
    with pytest.raises(ValueError, match="route|upstream"):
        parse_route(spec)


def test_file_then_flags(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('port = 9000\nupstream = "http://file"\ntag = "t"\n[routes]\n"/openai" = "http://o"\n')
    config = build(path, {"port": 9100, "routes": {"/anthropic": "http://a"}, "tag": None})
    assert (config.port, config.upstream, config.tag) == (9100, "http://file", "t")
    assert config.routes == {"/openai": "http://o", "/anthropic": "http://a"}


def test_unknown_setting_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("prot = 1\n")
    with pytest.raises(ConfigError, match="unknown setting.*prot"):
        build(path, {})


def test_no_upstream_message_shows_an_example() -> None:
    with pytest.raises(ConfigError, match="llmtap serve --upstream"):
        ServeConfig().route_table()


def test_print_config_round_trips(tmp_path: Path) -> None:
    given = tmp_path / "given.toml"
    given.write_text('admin_token = "secret-token"\n')
    result = CliRunner().invoke(main, ["serve", "--config", str(given), "--upstream", "http://u", "--route",
                                       "/a=http://a/x", "--port", "1234", "--host", "127.0.0.1", "--host", "::1",
                                       "--allow-origin", "http://localhost:3000", "--print-config"])
    assert result.exit_code == 0, result.output
    assert "secret-token" not in result.output
    path = tmp_path / "round.toml"
    path.write_text(result.output)
    config = build(path, {})
    assert (config.port, config.upstream, config.routes) == (1234, "http://u", {"/a": "http://a/x"})
    assert (config.host, config.allow_origins) == (["127.0.0.1", "::1"], ["http://localhost:3000"])


def test_non_loopback_needs_allow_remote() -> None:
    result = CliRunner().invoke(main, ["serve", "--upstream", "http://u", "--host", "0.0.0.0"])
    assert result.exit_code != 0 and "--allow-remote" in result.output


def test_every_command_means_the_same_database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--db, else $LLMTAP_DB, else the config file's db, else the default: for serve and the queries alike."""
    from proxy.settings.config import resolve_db
    from proxy.record.migrations import migrate

    config = tmp_path / "config.toml"
    configured = tmp_path / "configured.duckdb"
    config.write_text(f'db = "{configured}"\n')
    monkeypatch.setenv("LLMTAP_CONFIG", str(config))
    assert build(None, {}).db_path == resolve_db() == configured
    con = duckdb.connect(str(configured))
    migrate(con)
    con.execute("INSERT INTO requests (id) VALUES ('from-the-config-file')")
    con.close()
    out = CliRunner().invoke(main, ["sql", "SELECT id FROM requests", "--format", "csv"])
    assert out.exit_code == 0 and out.output == "id\nfrom-the-config-file\n", out.output
    monkeypatch.setenv("LLMTAP_DB", str(tmp_path / "env.duckdb"))
    assert build(None, {}).db_path == resolve_db() == tmp_path / "env.duckdb"
    assert build(None, {"db": str(tmp_path / "flag.duckdb")}).db_path == resolve_db(tmp_path / "flag.duckdb")
