"""llmtap analysis: named SQL, reports and experiments over the recorded requests."""
