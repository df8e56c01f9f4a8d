"""`llmtap ui`: open the running proxy's web UI with a one-time login link (proxy/relay/ui_doors.py)."""

from __future__ import annotations

import webbrowser

import click

from proxy.common.instances import AdminError, find_client
from proxy.common.terminal_text import echo


@click.command()
@click.option("--url", help="The proxy's base URL (default: the running `llmtap serve`, from its state file).")
@click.option("--admin-token", envvar="LLMTAP_ADMIN_TOKEN",
              help="The proxy's admin token (default: the running proxy's, from its owner-only state file).")
@click.option("--no-browser", is_flag=True, help="Print the login link instead of opening a browser.")
def ui(url: str | None, admin_token: str | None, no_browser: bool) -> None:
    """Open the web UI of the running proxy: live requests, waterfalls, sessions.

    Asks the proxy for a one-time login link (good once, for two minutes)
    and opens it; the browser trades it for a cookie and the link leaves
    the address bar. The page is served by `llmtap serve` itself at
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
    if no_browser or not webbrowser.open(link):
        echo(f"open this link (once, within two minutes): {link}")
    else:
        echo(f"opened the llmtap UI in your browser ({client.url}/_llmtap/ui/)")
