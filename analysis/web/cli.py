"""`llmtap ui`: open the running proxy's web UI with a one-time login link (proxy/relay/ui_doors.py).

The link is never on the browser's command line, which every local user reads in /proc/*/cmdline: as
jupyter_server does, `llmtap ui` writes an owner-only HTML file that sends the browser on to the link,
and opens the file's path."""

from __future__ import annotations

import contextlib
import html
import os
import tempfile
import time
import webbrowser
from pathlib import Path

import click

from proxy.common.instances import AdminError, find_client, private_dir, states
from proxy.common.terminal_text import echo

OPENER_PREFIX = "ui-open-"
OPENER_KEPT_S = 600.0  # older opener files (their tickets long dead) are removed by the next `llmtap ui`


def opener_file(link: str) -> Path:
    """An owner-only file (0600, in the 0700 run directory) that redirects the browser to `link`."""
    directory = private_dir()
    for old in directory.glob(f"{OPENER_PREFIX}*.html"):
        with contextlib.suppress(OSError):
            if time.time() - old.stat().st_mtime > OPENER_KEPT_S:
                old.unlink()
    fd, name = tempfile.mkstemp(prefix=OPENER_PREFIX, suffix=".html", dir=directory)  # 0600 from its creation
    quoted = html.escape(link, quote=True)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(f'<!doctype html>\n<meta charset="utf-8">\n<meta http-equiv="refresh" content="0;url={quoted}">\n'
                f'<title>llmtap</title>\n<p><a href="{quoted}">Open the llmtap UI</a></p>\n')
    return Path(name)


@click.command()
@click.option("--url", help="The proxy's base URL (default: the running `llmtap serve`, from its state file).")
@click.option("--admin-token", envvar="LLMTAP_ADMIN_TOKEN",
              help="The proxy's admin token (default: the running proxy's, from its owner-only state file).")
@click.option("--no-browser", is_flag=True, help="Print the login link instead of opening a browser.")
def ui(url: str | None, admin_token: str | None, no_browser: bool) -> None:
    """Open the web UI of the running proxy: live requests, waterfalls, sessions.

    Asks the proxy for a one-time login link (good once, for two minutes)
    and opens it through an owner-only file (so the link is not on the
    browser's command line); the page trades it for a session and the link
    leaves the address bar. The page is served by `llmtap serve` itself at
    /_llmtap/ui/ (docs/ui.md).
    """
    client = find_client(url, admin_token)
    if client is None:
        raise click.ClickException("no running `llmtap serve` found: start one, or give --url")
    try:
        answer = client.call("ui/ticket", {})
    except AdminError as exc:
        raise click.ClickException(str(exc)) from None
    link = f"{client.url}{answer['path']}{answer['ticket']}"
    if no_browser or not webbrowser.open(opener_file(link).as_uri()):
        echo(f"open this link (once, within two minutes): {link}")
    else:
        echo(f"opened the llmtap UI in your browser ({client.url}/_llmtap/ui/)")
    if url is None:
        which(client.url)


def which(opened: str) -> None:
    """With more than one `llmtap serve` running, which one the UI shows (the newest) and how to pick another."""
    found = states()
    if len(found) < 2:
        return
    echo(f"{len(found)} llmtap serves are running; this is the newest, {opened} (recording to "
         f"{next((s.db for s in found if s.url == opened), None) or 'no file'}). Another: llmtap ui --url URL")
    for s in found:
        if s.url != opened:
            echo(f"  --url {s.url}  records to {s.db or 'no file'}")
