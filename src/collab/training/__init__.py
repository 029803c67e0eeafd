"""Training machinery around the algorithms: callbacks (checkpoints, progress, evaluation), exact resume,
multi-process helpers and the checks of user input before a run starts."""
