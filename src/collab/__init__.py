"""collab: multi-agent reinforcement learning for teams of LLM agents, on Lightning."""

__version__ = "0.1.0"
