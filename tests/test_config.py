"""Routes and the serve configuration: defaults < config file < flags."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from proxy.cli import main
from proxy.config import ConfigError, ServeConfig, build
from proxy.routes import RouteTable, make_route, parse_route


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
