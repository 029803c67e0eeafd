import os
import warnings

import pytest

warnings.filterwarnings("ignore", message=".*kernels.*")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture
def one_thread():
    """Run a test on one torch thread (the tiny model's CPU kernels are faster and deterministic so)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """SmolLM2's tokenizer (the first call converts the GGUF once into the cache folder)."""
    from collab.models import load_tokenizer

    return load_tokenizer("tiny")


def quiet_fit(module, datamodule, steps: int):
    """Train ``module`` for ``steps`` optimizer updates on the CPU, without logs, checkpoints or warnings."""
    import logging

    import lightning as L

    trainer = L.Trainer(max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", devices=1)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, datamodule)
    return trainer


class ScriptedTeam:
    """Stands in for the agents where the policy is not under test: each sample's text is
    ``respond(agent, messages)``, ``messages`` being the history the agent was shown."""

    def __init__(self, respond):
        self.respond, self.prompts = respond, []

    def encode(self, agent, messages):
        self.prompts.append(messages)
        return [len(self.prompts) - 1]

    def generate(self, requests, max_new_tokens=128):
        from collab.sampling import Completion

        return [[Completion(r.agent, r.prompt_ids, [1], self.respond(r.agent, self.prompts[r.prompt_ids[0]]))
                 for _ in range(r.n)] for r in requests]
