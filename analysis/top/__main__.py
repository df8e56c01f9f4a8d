"""`python -m analysis.top`: the same as `llmtap top`."""

from analysis.top.cli import top

top(prog_name="llmtap top")
