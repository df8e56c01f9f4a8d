"""The `llmtap` command: a thin click layer over the library."""

from __future__ import annotations

import difflib
import importlib
from pathlib import Path
from typing import Any

import click

from proxy.settings import config as cfg
from proxy.settings.cli_options import config_option, db_option, workers_option
from proxy.settings.routes import RouteError, parse_route
from proxy.common.terminal_text import echo, printable, stderr_line


# Every command but serve, as "module:attribute": imported when it runs, so a command loads only what it
# needs (`llmtap --version` or `llmtap sql` never imports aiohttp's server, the simulator or the bench).
COMMANDS = {
    "mock-upstream": "proxy.simulator.cli:mock_upstream",
    "setup": "proxy.tools.cli:setup",
    "run": "proxy.tools.cli:run",
    "doctor": "proxy.tools.cli:doctor",
    "sql": "analysis.cli:sql",
    "report": "analysis.cli:report",
    "errors": "analysis.cli:errors",
    "export": "analysis.cli:export",
    "show": "analysis.cli:show",
    "sessions": "analysis.cli:sessions",
    "session": "analysis.cli:session",
    "prices": "analysis.cli:prices",
    "check": "analysis.cli:check",
    "keys": "proxy.tools.keys_cli:keys",
    "demo": "analysis.cli:demo",
    "bench": "analysis.bench.cli:bench",
    "compare": "analysis.compare_cli:compare",
    "top": "analysis.top.cli:top",
    "status": "analysis.upkeep_cli:status",
    "prune": "analysis.upkeep_cli:prune",
    "compact": "analysis.upkeep_cli:compact",
    "service": "proxy.tools.service_cli:service",
    "ui": "analysis.web.cli:ui",
}


class LazyGroup(click.Group):
    """A group whose commands in `COMMANDS` are imported the first time they are looked up."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, _, attribute = COMMANDS[cmd_name].partition(":")
            try:
                command = getattr(importlib.import_module(module), attribute)
            except ImportError as exc:  # pragma: no cover - analysis is part of the package
                echo(f"llmtap: {cmd_name} unavailable: {exc}", err=True)
                return None
            self.add_command(command, cmd_name)
        return self.commands.get(cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        """Every command; an error's message can quote stored data (DuckDB's quote a value that does
        not convert), so it leaves escaped like any output (proxy/common/terminal_text.py)."""
        try:
            return super().invoke(ctx)
        except click.ClickException as exc:
            exc.message = printable(exc.message, layout=True)  # type: ignore[misc]  # Final in the stubs
            raise

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        """Click's lookup, with the nearest command names for a typo (`llmtap reprot`)."""
        name = click.utils.make_str(args[0])
        if self.get_command(ctx, name) is None and not ctx.resilient_parsing and not name.startswith("-"):
            close = difflib.get_close_matches(name, self.list_commands(ctx), n=3, cutoff=0.6)
            if close:
                ctx.fail(f"No such command {name!r}. Did you mean {' or '.join(repr(c) for c in close)}?")
        return super().resolve_command(ctx, args)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="llmtap")
def main() -> None:
    """llmtap: a transparent measuring reverse proxy for LLM APIs."""
    if (problem := cfg.apply_default_prices()) is not None:  # the config's own [prices], for every command
        stderr_line(f"llmtap: {problem} (its prices are not used)")


def _routes(values: tuple[str, ...]) -> dict[str, str] | None:
    routes: dict[str, str] = {}
    for spec in values:
        try:
            route = parse_route(spec)
        except RouteError as exc:
            raise click.BadParameter(str(exc), param_hint="--route") from None
        routes[route.label] = str(route.upstream)
    return routes or None


def _pair(spec: str, option: str) -> tuple[str, str]:
    key, sep, value = spec.partition("=")
    if not sep or not value:
        raise click.BadParameter(f"expected PREFIX=VALUE, not {spec!r}", param_hint=option)
    return key, value


@main.command()
@config_option
@click.option("--host", "hosts", multiple=True, help="Address to listen on; repeatable (default localhost: 127.0.0.1 and ::1).")
@click.option("--port", type=int, help="Port to listen on (default 8787).")
@click.option("--upstream", help="Default upstream; the request path is appended to its path.")
@click.option("--route", "route_specs", multiple=True, metavar="PREFIX=URL", help="Extra route; the prefix is stripped, longest prefix wins. Repeatable.")
@db_option("db", resolve=False)
@click.option("--tag", help="Tag every row (a request's X-Llmtap-Tag header wins).")
@click.option("--quiet", is_flag=True, default=None, help="No per-request line on stderr.")
@click.option("--no-measure", "measure", flag_value=False, default=None, help="Relay only: no parsing, no rows (for overhead benchmarks).")
@click.option("--no-chunks", "record_chunks", flag_value=False, default=None, help="Do not record the per-event chunks table.")
@click.option("--connect-timeout", "connect_timeout_s", type=float, help="Seconds to connect upstream (default 10).")
@click.option("--idle-timeout", "idle_timeout_s", type=float, help="Seconds of upstream silence before giving up (default 600).")
@click.option("--max-body-mb", type=float, help="Largest request body in MiB (default 64).")
@click.option("--body-memory-mb", type=click.FloatRange(min=0, min_open=True), metavar="N", help="Request bodies held in memory at once, all requests together, in MiB (default 256); past it a request gets a 503.")
@click.option("--header-timeout", "header_timeout_s", type=click.FloatRange(min=0, min_open=True), metavar="S", help="Seconds a request's head may take, from the connection's start or its last answer's end (default 30); past it the connection is closed.")
@click.option("--max-connections", type=click.IntRange(min=1), metavar="N", help="Client connections open at once (default 10000, lowered to fit the open-file limit); past it a new one gets a 503.")
@click.option("--pool-size", type=int, help="Most upstream connections at once (default 0: no limit).")
@click.option("--ca-bundle", type=click.Path(exists=True, dir_okay=False), help="Extra CAs for TLS to the upstream, added to the system's (also read: REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE, NODE_EXTRA_CA_CERTS).")
@click.option("--upstream-proxy", metavar="URL", help="Reach the upstreams through this HTTP proxy (http://[user:pass@]host:port), or `none` to go direct; default: HTTPS_PROXY/HTTP_PROXY/NO_PROXY.")
@click.option("--route-proxy", "route_proxy", multiple=True, metavar="PREFIX=URL", callback=lambda _ctx, _param, specs: dict(_pair(s, "--route-proxy") for s in specs), help="The same for one route prefix (URL or `none`), winning over the rest. Repeatable.")
@click.option("--allow-remote", is_flag=True, default=None, help="Allow listening on a non-loopback address.")
@click.option("--admin-token-file", type=click.Path(exists=True, dir_okay=False), help="File holding the admin endpoint's token (owner-only; or $LLMTAP_ADMIN_TOKEN). Default: a new one per start, in the state file.")
@click.option("--allow-origin", "allow_origins", multiple=True, metavar="ORIGIN", help="Let web pages of ORIGIN (e.g. http://localhost:3000, or *) call the API through llmtap. Repeatable.")
@click.option("--allow-host", "allow_hosts", multiple=True, metavar="NAME", help="Accept this name in the Host header besides localhost, IP addresses and this machine's names. Repeatable.")
@click.option("--capture-bodies", is_flag=True, default=None, help="Store request and response bodies (decoded, secrets redacted) in the bodies table.")
@click.option("--capture-max-kb", type=click.IntRange(min=0), help="Keep at most this many KiB of each captured body (default 256).")
@click.option("--db-memory-mb", type=click.IntRange(min=16), help="DuckDB's memory limit inside the proxy, in MiB (default 256).")
@click.option("--sql-timeout", "sql_timeout_s", type=click.FloatRange(min=0, min_open=True), metavar="S", help="Stop a query through the proxy (llmtap sql while serving) after S seconds (default 60).")
@click.option("--sql-max-mb", type=click.FloatRange(min=0, min_open=True), metavar="N", help="Largest answer of a query through the proxy, in MiB of JSON (default 64).")
@click.option("--retain-days", type=click.FloatRange(min=0, min_open=True), metavar="N", help="Delete requests (with their chunks and bodies) older than N days: at start, then hourly.")
@click.option("--retain-bodies-days", type=click.FloatRange(min=0, min_open=True), metavar="N", help="Delete captured bodies of requests older than N days (the rows stay).")
@click.option("--otel-endpoint", help="Send spans and GenAI metrics to this OTLP/HTTP collector (needs llmtap[otel]).")
@click.option("--otel-headers", metavar="K=V,...", help="Headers for the OTLP exporter, e.g. Authorization=Bearer%20xyz.")
@click.option("--otel-service-name", help="service.name of the exported telemetry (default llmtap).")
@click.option("--update-prices", is_flag=True, default=None, help="Fetch genai-prices' latest price data hourly (network; default off: the package's own data).")
@click.option("--upstream-key-env", metavar="VAR", help="Replace the client's credential on the default route with the key in $VAR.")
@click.option("--route-key-env", "route_key_specs", multiple=True, metavar="PREFIX=VAR", help="The same for one route prefix. Repeatable.")
@workers_option
@click.option("--print-config", is_flag=True, help="Print the effective configuration as TOML and exit.")
def serve(config_path: Path | None, route_specs: tuple[str, ...], route_key_specs: tuple[str, ...],
          hosts: tuple[str, ...], print_config: bool, workers: int, **flags: Any) -> None:
    """Run the proxy: forward, relay and measure every request."""
    from proxy.serve.forever import serve_forever
    from proxy.common.event_loop import run
    from proxy.serve.server import check_bind
    from proxy.record.store_reader import StoreError
    from proxy.settings.client_key import SecretFileError

    try:
        keys = dict(_pair(spec, "--route-key-env") for spec in route_key_specs)
        host = (hosts[0] if len(hosts) == 1 else list(hosts)) if hosts else None
        config = cfg.build(config_path, {**flags, "host": host, "routes": _routes(route_specs), "route_key_env": keys})
        if print_config:
            echo(cfg.to_toml(config), nl=False)
            return
        config.route_table()
        check_bind(config)
        run(lambda: serve_forever(config, query_setup=_views(), workers=workers, ui=_ui()))
    except cfg.ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    except (StoreError, SecretFileError) as exc:  # a client key others can read, say: one line, no traceback
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"cannot listen: {exc}") from None


def _views() -> Any:
    """analysis's named views for the proxy's admin queries: this composition root is the one
    place where proxy/ meets analysis/."""
    from analysis.views import create_views

    return create_views


def _ui() -> Any:
    """analysis's web UI (its files and its JSON API) for /_llmtap/ui/ and /_llmtap/api/."""
    from analysis.web import WebUi

    return WebUi()
