"""The web UI served by `llmtap serve` at /_llmtap/ui/ (docs/ui.md): its files and its JSON API.

proxy/cli.py (the composition root) gives a `WebUi` to the proxy; the admin endpoint
(proxy/relay/admin.py) answers `/_llmtap/ui/<file>` with `asset` and `/_llmtap/api/<name>` with
`endpoint`, in its admin SQL threads. The doors (the one-time login, the cookie, the page's
policies) are the proxy's: proxy/relay/ui_doors.py.
"""

from __future__ import annotations

from collections.abc import Callable

from analysis.web import api
from analysis.web.assets import Assets


class WebUi:
    def __init__(self) -> None:
        self.assets = Assets.load()  # read once, at start: no file is read while serving

    def asset(self, path: str) -> tuple[bytes, str] | None:
        return self.assets.get(path)

    def endpoint(self, name: str) -> Callable[[api.Query, api.Params], api.Answer] | None:
        return api.endpoint(name)

    def __repr__(self) -> str:
        return f"WebUi({len(self.assets.files)} files)"


__all__ = ["WebUi"]
