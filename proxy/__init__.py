"""llmtap's proxy: forwarding and measuring.

The layers, from the wire inwards:

- ``app`` / ``forward`` / ``websocket`` do the I/O: they accept the client's
  request, pick the upstream from ``routes``, relay the response chunk by chunk
  and never wait on measuring.
- ``meter`` observes a copy of what was relayed: it takes a monotonic timestamp
  at each read, decodes a copy of compressed bodies (``decode``), splits SSE
  events (``sse``) and hands them to the API's ``dialects`` module, which does no
  I/O. When the request ends the meter produces one row (``schema``).
- ``store`` is just another observer: a writer thread takes rows from a bounded
  queue and writes them to DuckDB in batches, off the event loop.
- ``simulator`` is a built-in upstream that speaks the APIs, for tests, the demo
  and benchmarks.
"""
