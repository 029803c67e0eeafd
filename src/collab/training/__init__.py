"""Lightning's side of a run, around the algorithms: callbacks (adapters and reward summary, held-out evaluation,
progress display), the checkpoint callback and exact resume, the sharded strategy, and multi-process timeouts."""
