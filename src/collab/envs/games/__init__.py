"""PettingLLMs' grid games (Plan-Path, Sudoku, Sokoban), played by a tool agent and a plan agent:
:mod:`collab.envs.games.env`."""
