"""The ``writing`` environment (CoLLM, Section 5.1; reward of Appendix F.1; MAGRPO's expansion task):
:mod:`~collab.envs.writing.env` holds :class:`WritingEnv`, :mod:`~collab.envs.writing.reward` the TLDR reward's
terms, :mod:`~collab.envs.writing.arxiv` the arXiv abstract expansion task (``task: arxiv``)."""

from collab.envs.writing.env import WritingEnv

__all__ = ["WritingEnv"]
