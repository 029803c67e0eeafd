"""Coding collaboration (paper 002, E.2 and F.2): tasks, static analysis, reward, environment."""
