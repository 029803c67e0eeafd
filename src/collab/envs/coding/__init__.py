"""Coding collaboration (CoLLM, E.2 and F.2): tasks, static analysis, reward, environment."""
