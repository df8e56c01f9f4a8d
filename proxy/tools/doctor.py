"""`llmtap doctor`: every check that explains "my tool does not go through the proxy" or "every request fails".

The checks, in order: HTTP proxy variables, API-key variables, base URLs (the
variables and the tool settings that win over them), Gemini CLI's auth type, the running proxy, its fast
paths (proxy/relay/fast_paths.py), the tools' own telemetry (proxy/tools/telemetry_checks.py), the port, the database, and each upstream (DNS, TCP, TLS, GET of its model list).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from proxy.settings import config as cfg
from proxy.settings import egress
from proxy.settings.routes import normal_prefix
from proxy.tools import config_files, env_checks, local_checks, telemetry_checks, upstream_checks
from proxy.tools.agent_setup import Locations
from proxy.tools.check import Check, fail, ok, warn
from proxy.common.instances import LiveProxy, find_running


@dataclass(frozen=True)
class Options:
    env: dict[str, str]
    config_path: Path | None = None
    upstreams: tuple[str, ...] = ()
    db: str | None = None
    port: int | None = None
    timeout: float = 5.0


def upstream_urls(options: Options, config: cfg.ServeConfig | None, live: LiveProxy | None) -> list[str]:
    """--upstream, else the running proxy's routes, else the config file's."""
    if options.upstreams:
        return list(options.upstreams)
    routes = (live.health.get("routes") if live else None) or []
    if routes:
        return sorted({str(r["upstream"]) for r in routes if isinstance(r, dict) and r.get("upstream")})
    if config is None:
        return []
    return sorted({*([config.upstream] if config.upstream else []), *config.routes.values()})


def diagnose(options: Options) -> list[Check]:
    live = find_running()
    checks: list[Check] = []
    checks += env_checks.proxy_variables(options.env, live)
    checks += env_checks.api_keys(options.env)
    checks += env_checks.base_urls(options.env, live)
    checks += gemini_auth(options.env)
    checks.append(local_checks.running_proxy(live))
    checks.append(local_checks.fast_paths(live, options.env))
    checks += telemetry_checks.telemetry(options.env, live)
    # the running proxy's port and database, not the defaults, unless asked for others
    port = options.port or (urlsplit(live.url).port if live is not None else None)
    db = options.db or (live.db if live is not None else None)
    try:
        config: cfg.ServeConfig | None = cfg.build(options.config_path, {"db": db, "port": port})
    except cfg.ConfigError as exc:
        config = None
        checks.append(fail("config file", str(exc), "fix the file, or point --config at another one"))
    if config is not None:
        checks.append(local_checks.port(config, live))
        checks.append(local_checks.database(config.db_path, live))
    urls = upstream_urls(options, config, live)
    if not urls:
        checks.append(warn("upstream", "none configured, so there is nothing to reach",
                           "give one: llmtap serve --upstream https://api.anthropic.com (or set upstream = "
                           "\"...\" in ~/.config/llmtap/config.toml), or check one: llmtap doctor --upstream URL"))
    ca_bundle = config.ca_bundle if config is not None else None
    for url in urls:
        try:
            proxy = forward_proxy(url, options.env, config)
        except egress.EgressError as exc:
            checks.append(fail(f"upstream {url}", f"forward proxy: {exc}", "llmtap serve refuses to start with it too"))
            continue
        checks += upstream_checks.upstream(url, options.env, options.timeout, ca_bundle, proxy)
    return checks


def gemini_auth(env: dict[str, str]) -> list[Check]:
    """Gemini CLI pointed at llmtap (the variable, or ~/.gemini/.env) exits 41 without an auth type, and a
    Google login does not use the base URL."""
    path = Locations.from_env(env).gemini_settings
    try:
        pointed = env.get("GOOGLE_GEMINI_BASE_URL") or "GOOGLE_GEMINI_BASE_URL=" in (
            config_files.read_text(path.with_name(".env")) or "")
        settings = config_files.read_json_object(path) or {}
    except config_files.ConfigFileError as exc:
        return [fail("Gemini CLI settings", str(exc), "fix the file, or move it aside")]
    if not pointed:
        return []
    subject = f"{path} security.auth.selectedType"
    chosen = ((settings.get("security") or {}).get("auth") or {}).get("selectedType")
    if not chosen:
        return [fail(subject, "not set: Gemini CLI exits 41 (\"Invalid auth method selected\")",
                     "llmtap setup gemini-cli --write (sets gemini-api-key where none is)")]
    if chosen in ("oauth-personal", "cloud-shell", "compute-default-credentials"):
        return [warn(subject, f"{chosen}: a Google login talks to Code Assist, not to GOOGLE_GEMINI_BASE_URL, "
                     "so its requests are not measured", "use an API key (gemini-api-key) to go through llmtap")]
    return [ok(subject, chosen)]


def forward_proxy(url: str, env: dict[str, str], config: cfg.ServeConfig | None) -> egress.ForwardProxy | None:
    """The forward proxy `llmtap serve` would use for this upstream (its route's, when the config has one)."""
    if config is None:
        return egress.proxy_for(url, env)
    prefixes = [p for p, u in config.routes.items() if u.rstrip("/") == url.rstrip("/")]
    if config.upstream and config.upstream.rstrip("/") == url.rstrip("/"):
        prefixes.insert(0, "")
    route_proxies = {normal_prefix(p): v for p, v in config.route_proxy.items()}
    prefix = normal_prefix(prefixes[0]) if prefixes else ""
    return egress.proxy_for(url, env, config.upstream_proxy, route_proxies.get(prefix) if prefixes else None,
                            prefix or "/")


def exit_code(checks: list[Check]) -> int:
    return 1 if any(c.status == "FAIL" for c in checks) else 0


def render(checks: list[Check]) -> str:
    counts = {s: sum(c.status == s for c in checks) for s in ("OK", "WARN", "FAIL")}
    summary = f"{counts['FAIL']} FAIL, {counts['WARN']} WARN, {counts['OK']} OK"
    return "\n".join([c.render() for c in checks] + [summary]) + "\n"
