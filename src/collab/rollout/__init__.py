"""Rollouts: trajectory records, the MAGRPO rollout tree, and the RolloutDataModule."""
