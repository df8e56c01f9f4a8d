"""`python -m analysis.top`: the same as `llmtap top`."""

from .cli import top

top(prog_name="llmtap top")
