"""The ``writing`` environment (CoLLM, Section 5.1; reward of Appendix F.1): :mod:`~collab.envs.writing.env`
holds :class:`WritingEnv`, :mod:`~collab.envs.writing.reward` the reward's terms."""

from collab.envs.writing.env import WritingEnv

__all__ = ["WritingEnv"]
