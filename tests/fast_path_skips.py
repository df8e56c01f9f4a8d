"""A test of a detail only a fast path has (proxy/relay/fast_paths.py) is skipped where that path is off:
`.ci/run` runs the stream tests a second time with LLMTAP_FAST_PATHS=off."""

from __future__ import annotations

import pytest

from proxy.relay import fast_paths


def on(name: str) -> bool:
    return fast_paths.probe().on(name)


def needs(name: str) -> pytest.MarkDecorator:
    refused = fast_paths.probe().refused
    return pytest.mark.skipif(name in refused, reason=f"a detail of the {name} fast path, off here: {refused.get(name)}")
