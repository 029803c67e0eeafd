"""The ``matrix`` environment: the 2-agent matrix games of the MAGRPO appendix (Tables 1 and 2)."""

from collab.envs.matrix.env import MatrixEnv

__all__ = ["MatrixEnv"]
