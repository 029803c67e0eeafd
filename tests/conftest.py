import os
import warnings

import pytest

warnings.filterwarnings("ignore", message=".*kernels.*")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_configure(config):
    """``COLLAB_TEST_THREADS=N pytest ...`` runs the whole session on N torch intra-op threads
    (``torch.set_num_threads(N)`` once at start; unset: torch's default, one per core). Float32
    results through the model change in their last bits with the thread count (another summation
    order), so the suite is meant to pass at any N: run it at 1 and at 2+ to check a tolerance.
    Tests that use the ``one_thread`` fixture still drop to one thread for their own duration."""
    threads = os.environ.get("COLLAB_TEST_THREADS")
    if threads:
        import torch  # lazily: collecting or running torch-free tests does not import it

        torch.set_num_threads(int(threads))


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
    from collab.policy.models import load_tokenizer

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
        from collab.policy.sampling import Completion

        return [[Completion(r.agent, r.prompt_ids, [1], self.respond(r.agent, self.prompts[r.prompt_ids[0]]))
                 for _ in range(r.n)] for r in requests]


class EarlySolveEnv:
    """A 2-turn cooperative game where solving at turn 1 is optimal (the known-optimum learning tests).

    Every agent answers A or B (one token). All A solves the task: reward ``solve``, and the episode
    ends. Anything else earns ``partial`` and the team tries again, up to ``horizon`` turns. With the
    end valued as an absorbing state (the reward repeats until the horizon), solving at turn 1 is worth
    ``solve * H`` and solving at turn 2 ``partial + solve``: with partial < solve, earlier is better. An
    algorithm that kept only the rewards so far would value the early solve at ``solve`` alone and
    learn to postpone it (partial + solve > solve).
    """

    def __new__(cls, n_agents: int = 2, horizon: int = 2, solve: float = 1.0, partial: float = 0.6):
        from collab.envs.base import AgentRole, Env, Score

        class _EarlySolve(Env):
            name = "early_solve"
            reward_max = solve

            def __init__(self):
                super().__init__(horizon)
                self.roles = tuple(AgentRole(f"agent{i}", max_new_tokens=1, choices=("A", "B")) for i in range(n_agents))

            def tasks(self, split):
                return [{"id": 0}]

            def observe(self, task):
                return ["Solve the task together: answer A or B."] * self.n_agents

            def score(self, state, actions):
                solved = all(a.strip() == "A" for a in actions)
                r = solve if solved else partial
                return Score((r,) * self.n_agents, terminated=solved, info={"solved": float(solved)})

            def feedback(self, state, actions, score):
                return ["Not solved yet. Answer A or B again."] * self.n_agents

        return _EarlySolve()


def datamodule_for(env, batch_size: int = 4, seed: int = 0):
    """A RolloutDataModule playing ``env`` (an Env object, e.g. a test environment)."""
    from collab.rollout.datamodule import RolloutDataModule, TaskStream

    dm = RolloutDataModule(env="matrix", batch_size=batch_size, seed=seed)
    dm.env = env
    dm.stream = TaskStream(env.tasks("train"), batch_size, True, seed)
    return dm
