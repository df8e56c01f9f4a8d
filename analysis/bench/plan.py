"""The experiments as lists of points: what each request of a sweep asks for.

A point is one setting (input length, max_tokens, streaming, concurrency) and
how many measured requests it gets. The latency sweeps (input, output, stream)
send `runs` requests per point, `parallel` at a time (1 = the classic, one
request alone on the upstream). The concurrency sweep keeps `c` requests in
flight: c clients, each sending `runs` requests back to back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

EXPERIMENTS = ("input", "output", "concurrency", "stream")

DEFAULT_INPUTS = (200, 500, 1000, 2000, 4000)
DEFAULT_OUTPUTS = (50, 200, 500)
DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16, 32)

INPUT_SWEEP_MAX_TOKENS = 64
SHORT_INPUT = 100  # the output sweep's input length
CONCURRENCY_INPUT = 200
CONCURRENCY_MAX_TOKENS = 32
STREAM_INPUT = 500
STREAM_MAX_TOKENS = 64

TITLES = {
    "input": "input-length sweep: TTFT grows with input (prefill)",
    "output": "output-length sweep: TTFT flat, E2E grows",
    "concurrency": "concurrency sweep: throughput against TTFT and TPOT; the knee is where queueing starts",
    "stream": "streaming against non-streaming: the first word comes after TTFT, or after E2E without streaming",
}


@dataclass(frozen=True, slots=True)
class Point:
    experiment: str
    input_tokens: int
    max_tokens: int
    stream: bool = True
    concurrency: int = 1  # requests in flight at once
    requests: int = 1  # measured requests

    @property
    def label(self) -> str:
        mode = "stream" if self.stream else "no-stream"
        return f"{self.experiment} in={self.input_tokens} out={self.max_tokens} c={self.concurrency} {mode}"


@dataclass(frozen=True, slots=True)
class Experiment:
    name: str
    points: tuple[Point, ...]

    @property
    def requests(self) -> int:
        return sum(p.requests for p in self.points)


@dataclass(slots=True)
class PlanOptions:
    runs: int = 5
    parallel: int = 1
    inputs: tuple[int, ...] = DEFAULT_INPUTS
    outputs: tuple[int, ...] = DEFAULT_OUTPUTS
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    experiments: tuple[str, ...] = field(default=EXPERIMENTS)


def build_plan(options: PlanOptions) -> list[Experiment]:
    """The chosen experiments, in the order of EXPERIMENTS."""
    unknown = set(options.experiments) - set(EXPERIMENTS)
    if unknown:
        raise ValueError(f"unknown experiment(s): {', '.join(sorted(unknown))}")
    build = {"input": _input, "output": _output, "concurrency": _concurrency, "stream": _stream}
    return [Experiment(name, build[name](options)) for name in EXPERIMENTS if name in options.experiments]


def _latency(options: PlanOptions, name: str, input_tokens: int, max_tokens: int, stream: bool = True) -> Point:
    width = max(1, min(options.parallel, options.runs))
    return Point(name, input_tokens, max_tokens, stream, width, options.runs)


def _input(options: PlanOptions) -> tuple[Point, ...]:
    return tuple(_latency(options, "input", n, INPUT_SWEEP_MAX_TOKENS) for n in options.inputs)


def _output(options: PlanOptions) -> tuple[Point, ...]:
    return tuple(_latency(options, "output", SHORT_INPUT, n) for n in options.outputs)


def _stream(options: PlanOptions) -> tuple[Point, ...]:
    return tuple(_latency(options, "stream", STREAM_INPUT, STREAM_MAX_TOKENS, s) for s in (True, False))


def _concurrency(options: PlanOptions) -> tuple[Point, ...]:
    return tuple(Point("concurrency", CONCURRENCY_INPUT, CONCURRENCY_MAX_TOKENS, True, c, c * options.runs)
                 for c in options.concurrency)


def parse_counts(text: str) -> tuple[int, ...]:
    """'200,500,1000' -> (200, 500, 1000); each a positive integer."""
    values = tuple(int(part) for part in text.replace(" ", "").split(",") if part)
    if not values or any(v <= 0 for v in values):
        raise ValueError("give positive integers separated by commas, e.g. 200,500,1000")
    return values
