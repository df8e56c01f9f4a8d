"""`llmtap top`: a live terminal view of the running proxy.

feed.py reads the proxy's `GET /_llmtap/live` server-sent events, model.py
aggregates them, render.py lays out one frame as text, terminal.py draws it
with plain ANSI, run.py ties them together and cli.py is the click command.
"""
