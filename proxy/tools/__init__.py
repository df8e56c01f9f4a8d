"""Connecting real tools to llmtap: `setup`, `run`, `doctor` and `service`.

- ``endpoint``: the base URL each kind of client needs from the running proxy
  (found through proxy/common/instances.py).
- ``setup``: the configuration each tool needs, printed or merged into the
  tool's own file through ``config_files`` (backup, atomic replace) and
  ``toml_edit`` (tomlkit edits that keep the rest of a TOML file as it was).
- ``run``: one command through the proxy (the running one, or one on a
  ``background`` thread), tagged, then ``summary`` of its requests.
- ``doctor``: the checks that explain "my tool does not go through the proxy"
  or "every request fails": ``env_checks`` (HTTP proxies, keys, base URLs),
  ``local_checks`` (serve, port, database), ``upstream_checks`` (DNS, TCP,
  TLS, model list) over the probes of ``reach``; each finding is a ``check.Check``.
- ``service``: a systemd user unit or launchd agent that keeps `serve` running
  (``service_cli`` is its click group).
- ``cli``: the click commands, registered lazily by proxy/cli.py.
"""
