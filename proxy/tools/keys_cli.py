"""`llmtap keys name k:064b2c1d9e0f work`: a name for a key fingerprint, kept in the config file's
[key_names] table (proxy/settings/config.py) by an edit that leaves the rest of the file as it was
(proxy/tools/toml_edit.py). `report --limits`, `report --by key`, `check` and serve's warnings show it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import click

from proxy.common import paths
from proxy.common.private_file import write_private
from proxy.common.terminal_text import echo, printable
from proxy.settings import config as cfg
from proxy.settings.cli_options import config_option
from proxy.tools.toml_edit import TomlEditError, set_keys

FINGERPRINT = re.compile(r"k:[0-9a-f]{12}")


@click.group()
def keys() -> None:
    """Names for key fingerprints (the `key_fingerprint` column)."""


@keys.command("name")
@click.argument("fingerprint")
@click.argument("name")
@config_option
def name(fingerprint: str, name: str, config_path: Path | None) -> None:
    """Call FINGERPRINT (k: and 12 hex digits, as in `report --limits`) NAME."""
    if not FINGERPRINT.fullmatch(fingerprint):
        raise click.BadParameter(f"a key fingerprint is k: and 12 hex digits (k:064b2c1d9e0f), not {fingerprint!r}",
                                 param_hint="FINGERPRINT")
    name = name.strip()
    if not name or len(name) > 40 or printable(name) != name:
        raise click.BadParameter("a name is 1 to 40 printable characters", param_hint="NAME")
    path = config_path or paths.default_config_path()
    try:
        text = path.read_text() if path.exists() else ""
        new = set_keys(text, {}, ("key_names",), {fingerprint: name})
    except (OSError, TomlEditError, tomllib.TOMLDecodeError) as exc:
        raise click.ClickException(f"cannot edit {path}: {exc}") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, new)
    echo(f"{fingerprint} is now {name!r} (in {path}, [key_names])")


@keys.command("list")
@config_option
def list_(config_path: Path | None) -> None:
    """The names given, by fingerprint."""
    try:
        names = cfg.load_file(config_path or paths.default_config_path()).get("key_names") or {}
    except cfg.ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    if not names:
        echo("no key names yet: `llmtap keys name k:… NAME`")
    for fingerprint, given in sorted(names.items()):
        echo(f"{fingerprint}  {given}")
