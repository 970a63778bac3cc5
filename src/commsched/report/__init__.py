"""Reports: summaries, terminal tables, traces, pictures."""
