"""A simulated LLM upstream for tests, the demo and benchmarks.

- ``config``: ``SimConfig`` and the x-sim-* header overrides.
- ``app``: the aiohttp app and ``Simulator`` (run on a port, record requests).
- ``openai_chat``, ``openai_responses`` (+ ``websocket``), ``anthropic``, ``gemini``:
  each API's event sequence and JSON bodies; they build events and do no I/O
  beyond handing them to an ``emit.Emitter``.
- ``emit``: framing, gzip, one write per event, token pacing (``pacing``) and
  the injected mid-stream error or disconnect.
- ``exchange`` / ``respond``: parsing one request, answering it over HTTP.
- ``tokens``: the deterministic output text and the input token count
  (``expected_text(n)`` is what a response with n text tokens says).
"""
