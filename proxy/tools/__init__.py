"""Pointing real tools at llmtap: `setup`, `run` and `doctor`.

- ``endpoint``: find the running `llmtap serve` (its state file, checked with
  GET /_llmtap/health) and the base URL each kind of client needs from it.
- ``setup`` (with ``config_files`` and ``toml_edit``): the configuration each
  tool needs, printed or merged into the tool's own config file.
- ``run`` (with ``summary``): run one command through the proxy, tagged, and
  print what its requests did.
- ``doctor`` (with ``reach``): the checks that explain "my tool doesn't go
  through the proxy" or "every request fails".
- ``cli``: the click commands; ``register(group)`` adds them to `llmtap`.
"""
