"""How fast does the web UI's API answer on a big database? (#30: each query under 300 ms.)

Builds `--db` as benchmarks/report_speed.py does (300,000 requests, 15,000,000 chunks, 14 days;
reused when it has those counts), marks it migrated, serves it with `llmtap serve`'s own pieces in
this process (RunningProxy with the web UI, as proxy/cli.py builds it), then times each page's API
call end to end over HTTP, as the page makes it (with the admin token instead of the cookie): the
first call and the median of RUNS.

    python benchmarks/ui_api_speed.py --db PATH [--runs 5]
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from pathlib import Path

import aiohttp
import click
import duckdb

from analysis.views import create_views
from analysis.web import WebUi
from proxy.common.instances import TOKEN_HEADER
from proxy.serve.server import RunningProxy
from proxy.settings.config import ServeConfig

TARGET_MS = 300.0
REQUESTS, CHUNKS = 300_000, 15_000_000


def prepare(db: Path) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import report_speed
    from proxy.record.migrations import MIGRATIONS

    if report_speed.counts(db) != (REQUESTS, CHUNKS):
        db.unlink(missing_ok=True)
        print(f"building {db}: {report_speed.build(db, REQUESTS, CHUNKS):.0f} s")
    con = duckdb.connect(str(db))
    try:  # report_speed makes the tables as they are now: every migration is in them
        con.execute("CREATE TABLE IF NOT EXISTS _llmtap_migrations (name VARCHAR PRIMARY KEY, applied_at TIMESTAMPTZ)")
        for fn in MIGRATIONS:
            con.execute("INSERT INTO _llmtap_migrations VALUES (?, current_timestamp) ON CONFLICT DO NOTHING", [fn.__name__])
    finally:
        con.close()


async def measure(db: Path, runs: int) -> None:
    config = ServeConfig(port=0, upstream="http://127.0.0.1:9", db=str(db), quiet=True)
    async with RunningProxy(config, query_setup=create_views, ui=WebUi()) as proxy:
        async with aiohttp.ClientSession(headers={TOKEN_HEADER: proxy.admin_token}) as s:
            async def get(path: str) -> tuple[int, bytes]:
                async with s.get(proxy.url + "/_llmtap/api/" + path) as r:
                    return r.status, await r.read()

            _, body = await get("requests?since=24h&limit=1&sort=ttft_ms")
            import orjson

            row = orjson.loads(body)["rows"][0]
            one_id = row["id"]
            session = orjson.loads((await get("sessions?since=1h"))[1])["sessions"][0]["session"]
            calls = [
                ("requests, last 24 h, newest first", "requests?since=24h"),
                ("requests, all, sorted by TTFT, page 3", "requests?sort=ttft_ms&offset=100"),
                ("requests, all, model + outcome filter", "requests?model=gpt-5&outcome=http_error"),
                ("request/<id> (show, chunks, waterfall)", f"request/{one_id}"),
                ("sessions, last 1 h", "sessions?since=1h"),
                ("sessions, last 24 h", "sessions?since=24h"),
                ("session/<key>, last 1 h", f"session/{session}?since=1h"),
                ("report --by model, last 24 h", "report?since=24h"),
                ("overview (report --html's data), 24 h", "overview?since=24h"),
                ("compare two models, 24 h", "compare?by=model&a=gpt-5&b=claude-sonnet-4-5&since=24h"),
                ("facets, 7 d", "facets?since=7d"),
            ]
            print(f"load average {os.getloadavg()[0]:.1f}; {runs} runs each, end to end over HTTP")
            for label, path in calls:
                times = []
                for _ in range(runs):
                    started = time.perf_counter()
                    status, _ = await get(path)
                    times.append((time.perf_counter() - started) * 1000)
                    if status != 200:
                        print(f"  {label}: HTTP {status} {_[:200]!r}")
                        break
                median = statistics.median(times)
                mark = "" if median < TARGET_MS else f"  over {TARGET_MS:.0f} ms"
                print(f"  {label:<44} first {times[0]:7.0f} ms, median {median:7.0f} ms{mark}")


@click.command()
@click.option("--db", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The database (built when it lacks the rows).")
@click.option("--runs", default=5, show_default=True)
def main(db: Path, runs: int) -> None:
    """Time the web UI's API on a big database."""
    prepare(db)
    asyncio.run(measure(db, runs))


if __name__ == "__main__":
    main()
