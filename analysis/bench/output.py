"""A finished run as a table, JSON or CSV."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson
from yarl import URL

from analysis.formatting import csv_text
from analysis.bench.plan import TITLES
from analysis.bench.runner import BenchRun
from analysis.bench.summary import KNEE_GAIN, LATENCY_RISE, ExperimentSummary, PointSummary

METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")


@dataclass(frozen=True, slots=True)
class RunInfo:
    """What the run was pointed at, for the header and the JSON."""

    api: str
    model: str
    via: str
    base_url: str
    runs: int
    warmup: int
    db: str | None = None
    model_from: str = ""  # without --model: where the model came from


def point_label(p: PointSummary) -> str:
    point = p.point
    return {
        "input": f"{point.input_tokens} in",
        "output": f"{point.max_tokens} out",
        "concurrency": f"c={point.concurrency}",
        "stream": "stream" if point.stream else "no-stream",
    }.get(point.experiment, point.label)


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def point_record(p: PointSummary) -> dict[str, Any]:
    point = p.point
    record: dict[str, Any] = {
        "experiment": point.experiment, "target_input_tokens": point.input_tokens, "max_tokens": point.max_tokens,
        "stream": point.stream, "concurrency": point.concurrency, "requests": point.requests,
        "ok": p.ok, "errors": p.errors, "input_tokens": p.input_tokens, "output_tokens": p.output_tokens,
    }
    for name in METRICS:
        stat = getattr(p, name)
        base = name.removesuffix("_ms")
        record[f"{base}_p50_ms"], record[f"{base}_p95_ms"] = _round(stat.p50), _round(stat.p95)
    record.update(output_tokens_per_s=_round(p.output_tokens_per_s, 2), wall_s=_round(p.wall_s), knee=p.knee,
                  first_error=p.first_error)
    return record


def to_json(run: BenchRun, info: RunInfo) -> str:
    data = {
        "tag_base": run.tag_base, "started_at": run.started_at.isoformat(), **asdict(info),
        "requests_sent": run.sent, "elapsed_s": round(run.elapsed_s, 3), "stopped_by": run.stopped_by,
        "calibration": run.calibration and {"overhead_tokens": run.calibration.overhead,
                                            "tokens_per_word": run.calibration.per_word,
                                            "measured": run.calibration.measured},
        "experiments": [{"name": e.name, "tag": e.tag, "knee": e.knee, "points": [point_record(p) for p in e.points]}
                        for e in run.experiments],
    }
    return orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n"


def to_csv(run: BenchRun, info: RunInfo) -> str:
    rows = [{"tag": e.tag, **point_record(p)} for e in run.experiments for p in e.points]
    return csv_text(list(rows[0]), ([r.get(k) for k in rows[0]] for r in rows)) if rows else ""


_HEAD = ("point", "ok", "err", "in_tok", "out_tok", "ttft p50", "p95", "tpot p50", "p95", "itl p50", "p95",
         "e2e p50", "p95", "out tok/s")


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _row(p: PointSummary) -> list[str]:
    cells = [point_label(p), str(p.ok), str(p.errors), _num(p.input_tokens, 0), _num(p.output_tokens, 0)]
    for name in METRICS:
        stat = getattr(p, name)
        cells += [_num(stat.p50), _num(stat.p95)]
    cells.append(_num(p.output_tokens_per_s))
    if p.knee:
        cells.append("<- knee")
    return cells


def _grid(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows if i < len(r)) for i in range(len(_HEAD))]
    lines = []
    for r in rows:
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:len(_HEAD)], widths[1:])]
        lines.append("  ".join(cells + r[len(_HEAD):]).rstrip())
    return lines


def _experiment_table(e: ExperimentSummary, info: RunInfo) -> list[str]:
    first = e.points[0].point if e.points else None
    width = f", {first.concurrency} in flight" if first and e.name != "concurrency" else ""
    lines = [TITLES.get(e.name, e.name),
             f"tag {e.tag}; {info.runs} runs per point{width}; times in ms, median (p50) and p95"]
    lines += _grid([list(_HEAD)] + [_row(p) for p in e.points])
    if e.name == "concurrency":
        lines.append(_knee_line(e))
    errors = [p for p in e.points if p.first_error]
    if errors:
        lines.append(f"errors, the first: {errors[0].first_error}")
    return lines


def _knee_line(e: ExperimentSummary) -> str:
    rule = (f"throughput gain < {KNEE_GAIN:.0%} of linear while median TPOT or TTFT rose >= {LATENCY_RISE:.0%}")
    if e.knee is None:
        return f"knee: none in this sweep ({rule})"
    return f"knee: concurrency {e.knee} ({rule})"


def to_table(run: BenchRun, info: RunInfo) -> str:
    stopped = f"; stopped: {run.stopped_by}" if run.stopped_by else ""
    picked = f" ({info.model_from}: no --model)" if info.model_from else ""
    lines = [f"llmtap bench {run.tag_base}: {info.api} model {info.model}{picked} via {info.via}",
             f"warm-up {info.warmup} round(s) per experiment, excluded; "
             f"{run.sent} requests in {run.elapsed_s:.1f} s{stopped}"]
    if run.calibration is not None:
        c = run.calibration
        how = "from the upstream's usage" if c.measured else "guessed: the upstream reported no usage"
        lines.append(f"prompts: {c.overhead:.0f} tokens + {c.per_word:.2f} per word ({how})")
    for e in run.experiments:
        lines += [""] + _experiment_table(e, info)
    return "\n".join(lines) + "\n"


RENDERERS = {"table": to_table, "json": to_json, "csv": to_csv}

Recorded = list[tuple[str, str, int]]  # (tag, upstream host, rows)


def recording_notes(run: BenchRun, recorded: Recorded | None, *, db: str | None, base_url: str | None,
                    db_flag: Path | None, direct: bool) -> list[str]:
    """Where the rows went, a warning when they are short or went elsewhere, and the commands for charts."""
    if recorded is None:
        return ["not recorded: " + ("--direct" if direct else "could not read the rows back from the proxy")]
    by_tag: dict[str, int] = {}
    for tag, _host, count in recorded:
        by_tag[tag] = by_tag.get(tag, 0) + count
    lines = [f"recorded {sum(by_tag.values())} rows in {db or 'the proxy database'} under {run.tag_base}-*"]
    short = {tag: n for tag, n in run.finished.items() if by_tag.get(tag, 0) < n}
    if short:
        lines.append("warning: fewer rows than requests for " + ", ".join(
            f"{tag} ({by_tag.get(tag, 0)} of {n})" for tag, n in sorted(short.items())))
    hosts = sorted({host for _tag, host, _n in recorded})
    wanted = URL(base_url).host if base_url else None
    if wanted and hosts and wanted not in hosts:
        lines.append(f"warning: the proxy sent these to {', '.join(hosts)}, not to {wanted}; "
                     "check the route of the running proxy (--proxy-route)")
    flag = f" --db {db_flag}" if db_flag is not None else ""
    lines += [f"charts: llmtap report --tag {e.tag}{flag} --html bench-{e.name}.html" for e in run.experiments]
    return lines
