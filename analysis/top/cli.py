"""`llmtap top`: the click command (a thin layer over `run`)."""

from __future__ import annotations

import click

from proxy.common.schema import KINDS
from proxy.common.terminal_text import echo

from analysis.timewindow import parse_span
from analysis.top.feed import FeedError, find_proxy


def _window(ctx: click.Context, param: click.Parameter, value: str) -> float:
    span = parse_span(value)
    if span is None or span.total_seconds() <= 0:
        raise click.BadParameter(f"{value!r} is not a span like 30s, 5m or 1h")
    return span.total_seconds()


@click.command()
@click.option("--url", help="The proxy's base URL (default: the running `llmtap serve`, from its state file).")
@click.option("--admin-token", envvar="LLMTAP_ADMIN_TOKEN",
              help="The proxy's admin token, if it has one (default: the running proxy's).")
@click.option("--interval", type=click.FloatRange(min=0.05), default=0.25, show_default=True,
              help="Seconds between redraws.")
@click.option("--window", "window_s", default="5m", show_default=True, callback=_window,
              help="Span of the rolling percentiles and error counts (30s, 5m, 1h).")
@click.option("--once", is_flag=True, help="Print one frame to stdout and exit (for scripts).")
@click.option("--kind", "kinds", multiple=True, type=click.Choice(KINDS),
              help="Show finished requests of this kind (repeatable; default: generation).")
@click.option("--all", "all_kinds", is_flag=True, help="Show every kind: token counts, probes, model lists, ...")
@click.option("--include-bench", is_flag=True,
              help="Show `llmtap bench`'s requests (tags bench-...) too: only counted by default.")
def top(url: str | None, admin_token: str | None, interval: float, window_s: float, once: bool,
        kinds: tuple[str, ...], all_kinds: bool, include_bench: bool) -> None:
    """A live view of the running proxy: in flight, finished, percentiles, sessions.

    Refreshes a few times a second; q or Ctrl-C quits. The percentiles and
    error counts cover the last --window; sessions count every request seen
    since top started. Finished requests are generations unless --kind or
    --all (the errors line counts the others); `llmtap bench`'s requests are
    only counted unless --include-bench.
    """
    if kinds and all_kinds:
        raise click.UsageError("give --kind or --all, not both")
    chosen = () if all_kinds else kinds or ("generation",)
    from proxy.common.event_loop import run

    from analysis.top import run as runner

    try:
        proxy = find_proxy(url, admin_token)
        if once:
            lines = run(lambda: runner.once(proxy, window_s, chosen, include_bench))
            echo("\n".join(line.text for line in lines))
        else:
            run(lambda: runner.live(proxy, window_s, interval, chosen, include_bench))
    except FeedError as exc:
        raise click.ClickException(str(exc)) from None
