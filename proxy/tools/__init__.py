"""Pointing real tools at llmtap: `setup`, `run` and `doctor`.

- ``endpoint``: the running `llmtap serve` (its state file, checked with
  GET /_llmtap/health) and the base URL each kind of client needs from it.
- ``setup``: the configuration each tool needs, printed or merged into the
  tool's own file through ``config_files`` (backup, atomic replace) and
  ``toml_edit`` (text edits that keep the rest of a TOML file byte-identical).
- ``run``: one command through the proxy (the running one, or one on a
  ``background`` thread), tagged, then ``summary`` of its requests.
- ``doctor``: the checks that explain "my tool does not go through the proxy"
  or "every request fails": ``env_checks`` (HTTP proxies, keys, base URLs),
  ``local_checks`` (serve, port, database), ``upstream_checks`` (DNS, TCP,
  TLS, model list) over the probes of ``reach``; each finding is a ``check.Check``.
- ``cli``: the click commands; ``register(group)`` adds them to `llmtap`.
"""
