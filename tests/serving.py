"""The proxy as the tests compose it, as proxy/cli.py composes `llmtap serve`: `RunningProxy` with
analysis's named views run on the cursor of every admin and store query (proxy/ never imports
analysis/: the composition root gives them)."""

from __future__ import annotations

from typing import Any

from analysis.views import create_views
from proxy.record.store_reader import QuerySetup
from proxy.serve import server
from proxy.settings.config import ServeConfig


class RunningProxy(server.RunningProxy):
    """`proxy.serve.server.RunningProxy` given `query_setup=create_views` unless a test gives its own."""

    def __init__(self, config: ServeConfig, *, query_setup: QuerySetup | None = create_views, **kwargs: Any) -> None:
        super().__init__(config, query_setup=query_setup, **kwargs)
