"""What happened during a run: timed events (trace), memory by category, and traced communication."""
