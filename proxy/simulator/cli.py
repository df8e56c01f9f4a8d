"""`mock-upstream`: run the simulated upstream from the command line."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import ssl
import tempfile
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import click

from proxy.simulator.app import Simulator
from proxy.simulator.config import SimConfig
from proxy.simulator.tls import TLSSetupError, pair_context, private_ca_context
from proxy.common.terminal_text import echo

DEFAULTS = SimConfig()
COUNT = click.IntRange(min=0)
MS = click.FloatRange(min=0)


async def _serve(config: SimConfig, host: str, port: int, tls: ssl.SSLContext | None = None,
                 ca_file: str | None = None) -> None:
    """Serve until Ctrl-C or SIGTERM."""
    stop = asyncio.Event()
    with contextlib.suppress(NotImplementedError):  # Windows has no add_signal_handler
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with Simulator(config, host, port, record=False, ssl_context=tls) as sim:
        trust = f" (its CA certificate: {ca_file}; llmtap serve --ca-bundle {ca_file})" if ca_file else ""
        echo(f"mock upstream listening on {sim.url}{trust}")
        await stop.wait()


def _tls(tls: bool, ca_file: str | None, cert: str | None, key: str | None) -> tuple[ssl.SSLContext | None, str | None, bool]:
    """The server context the options ask for, the CA file written (if any), and whether it is
    a temporary one to remove at exit."""
    if (cert is None) != (key is None):
        raise click.UsageError("--tls-cert and --tls-key go together")
    try:
        if cert is not None and key is not None:
            if ca_file:
                raise click.UsageError("--tls-ca-file is for --tls's own CA: with --tls-cert, trust your CA")
            return pair_context(Path(cert), Path(key)), None, False
        if not tls:
            if ca_file:
                raise click.UsageError("--tls-ca-file goes with --tls")
            return None, None, False
        temporary = ca_file is None
        if ca_file is None:
            handle, ca_file = tempfile.mkstemp(prefix="llmtap-mock-upstream-ca-", suffix=".pem")
            os.close(handle)
        return private_ca_context(Path(ca_file)), ca_file, temporary
    except (TLSSetupError, OSError) as exc:
        raise click.ClickException(str(exc)) from None


def _run(main: Coroutine[Any, Any, None]) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        uvloop.run(main)


@click.command("mock-upstream", hidden=True)  # for tests, the demo and bench: not in `llmtap --help`
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8788, show_default=True, type=click.IntRange(0, 65535), help="Port (0: any free port).")
@click.option("--ttft-ms", type=MS, default=DEFAULTS.ttft_ms, show_default=True, help="Time to first token.")
@click.option("--itl-ms", type=MS, default=DEFAULTS.itl_ms, show_default=True, help="Delay between tokens.")
@click.option("--tokens", type=COUNT, default=DEFAULTS.tokens, show_default=True, help="Output text tokens.")
@click.option("--reasoning-tokens", type=COUNT, default=0, show_default=True, help="Reasoning tokens before the text.")
@click.option("--tool-call", is_flag=True, help="Answer with a tool call instead of text.")
@click.option("--tool-name", type=str, default=DEFAULTS.tool_name, show_default=True,
              help="The tool a tool call calls; several, comma-separated, are called together (Bash,Read).")
@click.option("--tool-args", type=str, help="The calls' arguments, one JSON object (default: generated text); "
              "with several tools, an object of each one's arguments by name.")
@click.option("--tool-script", is_flag=True,
              help="An agent's loop: a request whose history ends with a tool result gets text, not a call.")
@click.option("--error-status", type=click.IntRange(400, 599), help="Answer every request with this HTTP error.")
@click.option("--stream-error", is_flag=True, help="Fail each stream halfway with the API's error event.")
@click.option("--disconnect-after", type=COUNT, help="Drop the connection after N output events.")
@click.option("--gzip", is_flag=True, help="Gzip responses when the client accepts it.")
@click.option("--cache-read-tokens", type=COUNT, default=0, show_default=True, help="Cached input tokens reported.")
@click.option(
    "--prefill-us-per-token",
    type=MS,
    default=DEFAULTS.prefill_us_per_token,
    show_default=True,
    help="Extra TTFT per uncached input token, in microseconds.",
)
@click.option("--capacity", type=COUNT, default=0, show_default=True, help="Streams at full speed (0: no limit).")
@click.option("--model", help="Model name in responses (default: echo the request's).")
@click.option("--headers-delay-ms", type=MS, default=0, show_default=True,
              help="Hold every response's headers this long (a slower channel: an aggregator, a far region).")
@click.option("--connect-delay-ms", type=MS, default=0, show_default=True,
              help="Hold each new connection this long (in the TLS handshake for https): a fresh connection's cost.")
@click.option("--no-keep-alive", "keep_alive", flag_value=False, default=True,
              help="Close each connection after its response: every request opens a new one.")
@click.option("--state-processing", is_flag=True,
              help="State the server's time on each answer (openai-processing-ms, Server-Timing, the WebSocket "
              "timing frame), without --headers-delay-ms: llmtap shows that delay as the path.")
@click.option("--tls", is_flag=True,
              help="Serve https, with a certificate from a private CA made at start (needs trustme); "
              "its CA certificate goes to --tls-ca-file, for serve --ca-bundle.")
@click.option("--tls-ca-file", type=click.Path(dir_okay=False),
              help="Where --tls writes its CA certificate (default: a temporary file, printed, removed at exit).")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False),
              help="Serve https with this certificate (PEM, with its chain), and --tls-key.")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), help="The key of --tls-cert (PEM).")
@click.option("--ratelimit-requests", type=click.IntRange(min=1), default=DEFAULTS.ratelimit_requests, show_default=True,
              help="Requests per API key per --ratelimit-window-s, stated in each response's limit headers; a 429 past it.")
@click.option("--ratelimit-window-s", type=click.FloatRange(min=0, min_open=True), default=DEFAULTS.ratelimit_window_s,
              show_default=True, help="The API keys' rate-limit window, in seconds.")
@click.option("--subscription-5h-tokens", type=click.IntRange(min=1), default=DEFAULTS.subscription_5h_tokens,
              show_default=True, help="Tokens a Claude login may use per 5 hours (the unified headers' utilization).")
def mock_upstream(host: str, port: int, tls: bool, tls_ca_file: str | None, tls_cert: str | None,
                  tls_key: str | None, **fields: Any) -> None:
    """Run a simulated OpenAI / Anthropic / Gemini upstream until Ctrl-C."""
    context, ca_file, temporary = _tls(tls, tls_ca_file, tls_cert, tls_key)
    try:
        _run(_serve(SimConfig(**fields), host, port, context, ca_file))
    except KeyboardInterrupt:
        pass
    except OSError as exc:  # the port is taken, or the address is not this machine's: one line, as serve says it
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    finally:
        if temporary and ca_file:
            with contextlib.suppress(OSError):
                os.unlink(ca_file)
