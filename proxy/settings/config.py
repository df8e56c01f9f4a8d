"""`llmtap serve` settings: defaults, then the TOML config file, then flags."""

from __future__ import annotations

import os
import secrets
import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from yarl import URL

from proxy.settings import egress
from proxy.settings.alerts import AlertsError, check_alerts
from proxy.common import latency, paths, prices
from proxy.settings.routes import Route, RouteError, RouteTable, make_route, normal_prefix

EXAMPLE = (
    "  llmtap serve --upstream https://api.openai.com\n"
    "  llmtap serve --route /anthropic=https://api.anthropic.com --route /openai=https://api.openai.com\n"
    "  llmtap serve --upstream http://127.0.0.1:8788   # with `llmtap mock-upstream` running"
)


class ConfigError(ValueError):
    """A setting llmtap cannot start with; the message says how to fix it."""


@dataclass
class ServeConfig:
    # Where to listen: an address, or several. "localhost" is both loopback addresses, 127.0.0.1 and ::1
    # (where the system has IPv6): clients resolve localhost to ::1 first on many systems.
    host: str | list[str] = "localhost"
    port: int = 8787
    upstream: str | None = None
    routes: dict[str, str] = field(default_factory=dict)
    db: str | None = None
    tag: str | None = None
    quiet: bool = False
    measure: bool = True
    record_chunks: bool = True
    connect_timeout_s: float = 10.0
    idle_timeout_s: float = 600.0
    max_body_mb: float = 64.0
    # Request bodies held in memory at once, all requests together (proxy/relay/body_budget.py): past it, a 503.
    body_memory_mb: float = 256.0
    # A request's head must be complete this soon after the connection opens or its last answer ends
    # (and an idle connection closes then); connections open at once (proxy/relay/conn_limit.py).
    header_timeout_s: float = 30.0
    max_connections: int = 10_000
    pool_size: int = 0
    ca_bundle: str | None = None
    flush_interval_s: float = latency.STORE_FLUSH_S  # the store's share of the row's budget (proxy/common/latency.py)
    allow_remote: bool = False
    # The admin endpoint's secret: this, else $LLMTAP_ADMIN_TOKEN, else the file, else one made per start
    # (kept in the owner-only state file, where llmtap's own commands read it).
    admin_token: str | None = None
    admin_token_file: str | None = None
    # Web pages are refused (proxy/relay/guard.py) but for these origins; Host names this machine, or one of these.
    allow_origins: list[str] = field(default_factory=list)
    allow_hosts: list[str] = field(default_factory=list)
    # Off by default: request and response bodies (decoded, secrets redacted) in the `bodies` table.
    capture_bodies: bool = False
    capture_max_kb: int = 256
    db_memory_mb: int = 256  # DuckDB's memory limit in the proxy (its cache of the database, queries)
    # Admin SQL (`llmtap sql` while serving): a query is stopped after this many seconds, and its answer
    # (its rows as JSON) is at most this many MiB.
    sql_timeout_s: float = 60.0
    sql_max_mb: float = 64.0
    # Retention: requests (with their chunks and bodies) older than this many days are deleted as the
    # proxy runs, at start and then hourly (proxy/record/store.py, proxy/record/retention.py); bodies alone sooner. None: kept.
    retain_days: float | None = None
    retain_bodies_days: float | None = None
    otel_endpoint: str | None = None  # OTLP/HTTP base URL, e.g. http://127.0.0.1:4318; export is off when unset
    otel_headers: str | None = None  # "key=value,key2=value2", the OTEL_EXPORTER_OTLP_HEADERS form
    otel_service_name: str = "llmtap"
    # Fetch genai-prices' latest price data hourly (network); off: the data in the installed package
    update_prices: bool = False
    # Credential injection (opt-in): the environment variable holding the real upstream key, for the
    # default route and per route prefix. The client's own credential is then replaced.
    upstream_key_env: str | None = None
    route_key_env: dict[str, str] = field(default_factory=dict)
    # The forward proxy to the upstreams (proxy/settings/egress.py): unset, HTTPS_PROXY/HTTP_PROXY/NO_PROXY as
    # the SDKs read them; a URL (credentials may be in it, never printed); "none": direct. Per route
    # prefix too, where a URL or "none" wins over everything else.
    upstream_proxy: str | None = None
    route_proxy: dict[str, str] = field(default_factory=dict)
    # Your own prices (docs/cost-and-limits.md): USD per million tokens by model name, {"input", "output",
    # "cache_read", "cache_write"}, winning over genai-prices; and a markup in percent per route prefix.
    prices: dict[str, dict[str, float]] = field(default_factory=dict)
    price_markup: dict[str, float] = field(default_factory=dict)
    # What `llmtap check` and serve's warning line watch (proxy/settings/alerts.py): ttft_p95_ms,
    # error_rate, window_5h_utilization, daily_budget_usd.
    alerts: dict[str, float] = field(default_factory=dict)
    # Names for key fingerprints ("k:064b…" = "work"), written by `llmtap keys name`.
    key_names: dict[str, str] = field(default_factory=dict)

    def listen_addresses(self) -> list[tuple[str, bool]]:
        """(address, required) to listen on, in order; ::1 from "localhost" is optional (no IPv6)."""
        given = [self.host] if isinstance(self.host, str) else list(self.host)
        out: dict[str, bool] = {}
        for host in given:
            for address in (("127.0.0.1", True), ("::1", False)) if host == "localhost" else ((host, True),):
                out[address[0]] = out.get(address[0], False) or address[1]
        return list(out.items())

    @property
    def main_host(self) -> str:
        """The address clients are told to use (the banner, `setup`, the state file)."""
        return self.listen_addresses()[0][0]

    @property
    def db_path(self) -> Path:
        return Path(self.db).expanduser() if self.db else paths.default_db_path()

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * 1024 * 1024)

    @property
    def body_memory_bytes(self) -> int:
        return int(self.body_memory_mb * 1024 * 1024)

    @property
    def sql_max_bytes(self) -> int:
        return int(self.sql_max_mb * 1024 * 1024)

    def route_table(self) -> RouteTable:
        routes: list[Route] = []
        try:
            keys = {normal_prefix(p): var for p, var in self.route_key_env.items()}
            if self.upstream_key_env:
                keys[""] = self.upstream_key_env
            if self.upstream:
                routes.append(make_route("", self.upstream, _key_from_env(keys.pop("", None))))
            for prefix, url in self.routes.items():
                routes.append(make_route(prefix, url, _key_from_env(keys.pop(normal_prefix(prefix), None))))
            proxies = {normal_prefix(p): url for p, url in self.route_proxy.items()}
            routes = [self._with_proxy(route, proxies.pop(route.prefix, None)) for route in routes]
            table = RouteTable(routes)
        except RouteError as exc:
            raise ConfigError(str(exc)) from None
        if keys:
            raise ConfigError(f"a key is configured for route(s) that do not exist: {', '.join(k or '/' for k in keys)}")
        if proxies:
            raise ConfigError(f"a proxy is configured for route(s) that do not exist: {', '.join(p or '/' for p in proxies)}")
        try:
            egress.check_ca_bundles(self.ca_bundle)
        except egress.EgressError as exc:
            raise ConfigError(str(exc)) from None
        if not routes:
            raise ConfigError("no upstream configured. Give one, for example:\n" + EXAMPLE)
        return table

    def _with_proxy(self, route: Route, route_proxy: str | None) -> Route:
        """The route with its forward proxy (or none), resolved from the settings and the environment."""
        try:
            found = egress.proxy_for(str(route.upstream), os.environ, self.upstream_proxy, route_proxy, route.label)
        except egress.EgressError as exc:
            raise ConfigError(str(exc)) from None
        if found is None:
            return route
        return replace(route, proxy=URL(found.url), proxy_headers=egress.proxy_headers(found))


_FIELDS = {f.name for f in fields(ServeConfig)}
_TABLES = ("routes", "route_key_env", "route_proxy", "price_markup", "alerts", "key_names")
_LISTS = ("allow_origins", "allow_hosts")
_POSITIVE = {"retain_days": "days", "retain_bodies_days": "days", "sql_timeout_s": "seconds", "sql_max_mb": "MiB",
             "body_memory_mb": "MiB", "header_timeout_s": "seconds", "max_connections": "connections"}


def _key_from_env(var: str | None) -> str | None:
    if var is None:
        return None
    value = os.environ.get(var, "").strip()
    if not value:
        raise ConfigError(f"credential injection: the environment variable {var} is not set or empty")
    return value


def load_file(path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    unknown = set(data) - _FIELDS
    if unknown:
        raise ConfigError(f"unknown setting(s) in {path}: {', '.join(sorted(unknown))}; "
                          f"known: {', '.join(sorted(_FIELDS))}")
    return data


def resolve_db(db: str | Path | None = None, config_path: Path | None = None) -> Path:
    """The database every command means: `db` (its --db), else $LLMTAP_DB, else the config file's
    `db`, else the default (paths.default_db_path)."""
    if db:
        return Path(db).expanduser()
    if env := os.environ.get("LLMTAP_DB"):
        return Path(env).expanduser()
    try:
        configured = load_file(config_path or paths.default_config_path()).get("db")
    except ConfigError:
        configured = None
    return Path(configured).expanduser() if configured else paths.default_db_path()


def build(config_path: Path | None, overrides: dict[str, Any]) -> ServeConfig:
    """Defaults < config file < $LLMTAP_DB < flags (overrides whose value is None are unset)."""
    path = config_path or paths.default_config_path()
    if config_path is not None and not config_path.exists():
        raise ConfigError(f"config file {config_path} does not exist")
    values: dict[str, Any] = load_file(path)
    if env_db := os.environ.get("LLMTAP_DB"):
        values["db"] = env_db
    for key, value in overrides.items():
        if key in _TABLES:
            if value:
                values[key] = {**values.get(key, {}), **value}
        elif key in _LISTS:
            if value:
                values[key] = [*values.get(key, []), *value]
        elif value is not None:
            values[key] = value
    for key, unit in _POSITIVE.items():
        value = values.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            raise ConfigError(f"{key} is a number of {unit} above 0, not {value!r}")
    check_prices(values.get("prices") or {}, values.get("price_markup") or {})
    try:
        check_alerts(values.get("alerts") or {})
    except AlertsError as exc:
        raise ConfigError(str(exc)) from None
    try:
        return ServeConfig(**values)
    except TypeError as exc:
        raise ConfigError(f"bad setting: {exc}") from None


def check_prices(table: Any, markup: Any) -> None:
    """`[prices]`: a table per model of USD per million tokens (numbers >= 0, among prices.CONFIG_KEYS);
    `[price_markup]`: percent per route prefix."""
    if not isinstance(table, dict):
        raise ConfigError("prices is a table of models, e.g. [prices.\"my-model\"] with input = 1.0, output = 4.0")
    for model, price in table.items():
        if not isinstance(price, dict) or not price:
            raise ConfigError(f"prices.{model} is a table of USD per million tokens: "
                              f"{', '.join(prices.CONFIG_KEYS)}")
        unknown = set(price) - set(prices.CONFIG_KEYS)
        if unknown:
            raise ConfigError(f"prices.{model}: unknown key(s) {', '.join(sorted(unknown))}; "
                              f"known: {', '.join(prices.CONFIG_KEYS)}")
        for key, value in price.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ConfigError(f"prices.{model}.{key} is USD per million tokens (a number >= 0), not {value!r}")
    if not isinstance(markup, dict):
        raise ConfigError("price_markup is a table of route prefix = percent, e.g. \"/openrouter\" = 5.5")
    for prefix, value in markup.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= -100:
            raise ConfigError(f"price_markup.{prefix} is a percent above -100, not {value!r}")


def apply_prices(config: ServeConfig, origin: str | None = None) -> None:
    """Give the config's own prices and markups to proxy.common.prices (the views, metrics, `run`)."""
    markup = {("/" if not normal_prefix(p) else normal_prefix(p)): pct for p, pct in config.price_markup.items()}
    prices.configure(config.prices, markup, origin)


def key_names(config_path: Path | None = None) -> dict[str, str]:
    """The config file's [key_names] (`llmtap keys name`): fingerprint -> name; {} when unreadable."""
    try:
        names = load_file(config_path or paths.default_config_path()).get("key_names") or {}
    except ConfigError:
        return {}
    return {str(k): str(v) for k, v in names.items()} if isinstance(names, dict) else {}


def apply_default_prices() -> str | None:
    """The default config file's prices (for a command without --config); its error, if any, as text."""
    path = paths.default_config_path()
    try:
        values = load_file(path)
        table, markup = values.get("prices") or {}, values.get("price_markup") or {}
        check_prices(table, markup)
    except ConfigError as exc:
        prices.configure({}, {}, None)
        return str(exc)
    apply_prices(ServeConfig(prices=table, price_markup=markup), str(path) if table or markup else None)
    return None


def to_toml(config: ServeConfig) -> str:
    """The effective configuration, as a config file that reproduces it."""
    lines, data = [], asdict(config)
    tables = {name: data.pop(name) for name in _TABLES}
    own_prices = data.pop("prices")
    for key, value in data.items():
        if value is None:
            lines.append(f"# {key} = (unset)")
        elif key in ("admin_token", "otel_headers"):
            lines.append(f"# {key} is set (hidden)")
        elif key == "upstream_proxy":
            lines.append(f"{key} = {_toml_value(egress.hide_credentials(value))}")
        else:
            lines.append(f"{key} = {_toml_value(value)}")
    for name, table in tables.items():
        if table:
            lines.append(f"\n[{name}]")
            shown = {k: egress.hide_credentials(v) for k, v in table.items()} if name == "route_proxy" else table
            lines.extend(f"{_toml_value(k)} = {_toml_value(v)}" for k, v in shown.items())
    for model, price in own_prices.items():
        lines.append(f"\n[prices.{_toml_value(model)}]")
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in price.items())
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    escaped = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def admin_token(config: ServeConfig) -> str:
    """The admin endpoint's secret: configured (file config, $LLMTAP_ADMIN_TOKEN, a token file),
    else a new one for this start. Never taken from the command line, where `ps` shows it."""
    if config.admin_token:
        return config.admin_token
    if token := os.environ.get("LLMTAP_ADMIN_TOKEN", "").strip():
        return token
    if config.admin_token_file:
        from proxy.settings.client_key import SecretFileError, read_secret_file

        try:
            return read_secret_file(Path(config.admin_token_file).expanduser())
        except SecretFileError as exc:
            raise ConfigError(f"--admin-token-file: {exc}") from None
    return secrets.token_urlsafe(32)
