"""`llmtap bench`: the classic latency experiments, recorded like daily use.

- ``plan``: the experiments as points (input length, max_tokens, streaming,
  concurrency, how many requests).
- ``prompts``: prompts of a target token length, calibrated from the
  upstream's reported usage.
- ``client``: one request, OpenAI Chat Completions or Anthropic Messages,
  measured client-side (TTFT, ITL, TPOT, E2E, tokens) as vLLM's `bench serve`.
- ``runner``: calibration, warm-up, concurrency, count and time bounds, stop.
- ``summary``: median and p95 per point, throughput, the concurrency knee.
- ``upstream``: through the running proxy, an in-process one, or direct; the
  built-in simulated upstream.
- ``run``: one whole run; ``output``: table, JSON, CSV; ``cli``: the command.
"""
