"""llmtap's proxy: relaying and measuring, one layer per folder, lowest first.

``common`` (what all share) < ``settings`` < ``meter`` (measuring, no I/O) < ``record`` (the
recorder, the DuckDB store) < ``observe`` (metrics, OpenTelemetry, the live feed) < ``relay`` (the
aiohttp app, the reverse and WebSocket relays) < ``serve`` (running it, ``--workers``) < ``tools``
(setup, run, doctor, service). ``cli`` is the composition root, the one module that meets
``analysis``; ``simulator`` is the simulated upstream, on ``common`` alone.

The map, one request's path through it, the processes and threads: docs/development.md.
``tests/test_layers.py`` holds the layers.
"""
