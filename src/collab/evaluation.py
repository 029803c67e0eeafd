"""Evaluation: play ``num_samples`` independent episodes per task and aggregate them with torchmetrics.

Every episode is a full (possibly multi-turn) rollout with the team's sampling settings; at the first
turn the ``num_samples`` episodes of a task share one prompt (one prefill, ``n`` samples), later turns
continue each episode on its own history. What counts is the episode's last step:

- ``eval/return``: the mean undiscounted return of an episode;
- ``eval/env/<key>``: the mean of each env info value at the last step (reward components, the
  cooperation-scheme one-hots ``scheme/<name>`` of the coding env, ...);
- for environments reporting ``solved`` and ``pass_rate`` (coding): ``eval/pass@k`` (unbiased estimator,
  :class:`~collab.metrics.PassAtK`) and ``eval/acc@k`` (:class:`~collab.metrics.AccuracyAtK`) for every
  ``k <= num_samples``, as in paper 002's Table 2.

Under DDP each process plays a shard of the tasks (``rank::world_size``); the metrics' states are
summed across processes when computed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torchmetrics import MeanMetric

from collab.envs.base import Env, EnvState, StepResult
from collab.errors import require
from collab.metrics import AccuracyAtK, PassAtK
from collab.sampling import GenerationRequest

DEFAULT_KS = (1, 3, 5, 10)


@dataclass
class Episode:
    """One sampled episode: its steps and the agents' responses at every turn."""

    task: int
    steps: list[StepResult] = field(default_factory=list)
    responses: list[list[str]] = field(default_factory=list)

    @property
    def state(self) -> EnvState | None:
        return self.steps[-1].state if self.steps else None

    @property
    def done(self) -> bool:
        return bool(self.steps) and self.steps[-1].done

    @property
    def return_(self) -> float:
        return sum(step.rewards[0] for step in self.steps)

    @property
    def info(self) -> Mapping[str, float]:
        return self.steps[-1].info if self.steps else {}


def play(team, env: Env, tasks: Sequence[Mapping], num_samples: int, max_new_tokens: int = 128,
         tasks_per_batch: int | None = None) -> list[list[Episode]]:
    """``num_samples`` episodes of each task, every turn of all live episodes in one ``team.generate``.

    ``tasks_per_batch`` plays the tasks in chunks of that many (bounding the decoding batch, and so
    the KV cache, at ``tasks_per_batch x n_agents x num_samples`` rows); ``None`` plays all at once.
    """
    require(num_samples >= 1, f"num_samples must be >= 1, got {num_samples}")
    if tasks_per_batch and len(tasks) > tasks_per_batch:
        out = []
        for start in range(0, len(tasks), tasks_per_batch):
            for eps in play(team, env, tasks[start:start + tasks_per_batch], num_samples, max_new_tokens):
                for ep in eps:
                    ep.task += start
                out.append(eps)
        return out
    episodes = [[Episode(t) for _ in range(num_samples)] for t in range(len(tasks))]
    # A group is (state, the episodes that continue from it): one group per task at the first turn.
    groups = [(env.reset(task), eps) for task, eps in zip(tasks, episodes)]
    n = env.n_agents
    while groups:
        requests = [GenerationRequest(i, team.encode(i, state.histories[i]), len(eps)) for state, eps in groups for i in range(n)]
        outs = team.generate(requests, max_new_tokens=max_new_tokens)
        states, actions, owners = [], [], []
        for g, (state, eps) in enumerate(groups):
            for j, ep in enumerate(eps):
                joint = [outs[g * n + i][j].text for i in range(n)]
                states.append(state)
                actions.append(joint)
                owners.append(ep)
        for ep, joint, step in zip(owners, actions, env.step_batch(states, actions)):
            ep.steps.append(step)
            ep.responses.append(joint)
        groups = [(ep.state, [ep]) for ep in owners if not ep.done]
    return episodes


def _shard(tasks: Sequence[Mapping]) -> list[Mapping]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        return list(tasks)[rank::world]
    return list(tasks)


def evaluate(team, env: Env, tasks: Sequence[Mapping], num_samples: int = 10, ks: Sequence[int] = DEFAULT_KS,
             max_new_tokens: int = 128, device: torch.device | str = "cpu",
             tasks_per_batch: int | None = 4) -> tuple[dict[str, float], list[list[Episode]]]:
    """The metrics of ``num_samples`` episodes per task (see the module docstring) and the episodes."""
    ks = sorted({int(k) for k in ks if int(k) <= num_samples})
    require(len(ks) > 0, f"no k <= num_samples ({num_samples}); give num_samples >= the smallest k")
    episodes = play(team, env, _shard(tasks), num_samples, max_new_tokens, tasks_per_batch) if tasks else []
    returns = MeanMetric().to(device)
    info_means: dict[str, MeanMetric] = {}
    pass_k = {k: PassAtK(k).to(device) for k in ks}
    acc_k = {k: AccuracyAtK(k).to(device) for k in ks}
    coded = False
    for eps in episodes:
        for ep in eps:
            returns.update(ep.return_)
            for key, value in ep.info.items():
                info_means.setdefault(key, MeanMetric().to(device)).update(float(value))
        if eps and all("solved" in ep.info and "pass_rate" in ep.info for ep in eps):
            coded = True
            n_correct = torch.tensor([sum(int(ep.info["solved"] > 0.5) for ep in eps)])
            for k in ks:
                pass_k[k].update(torch.tensor([len(eps)]), n_correct)
                acc_k[k].update([torch.tensor([ep.info["pass_rate"] for ep in eps])])
    metrics = {"eval/return": float(returns.compute()) if episodes else float("nan"),
               "eval/problems": float(len(tasks)), "eval/samples": float(num_samples)}
    metrics.update({f"eval/env/{key}": float(m.compute()) for key, m in sorted(info_means.items())})
    if coded:
        metrics.update({f"eval/pass@{k}": float(pass_k[k].compute()) for k in ks})
        metrics.update({f"eval/acc@{k}": float(acc_k[k].compute()) for k in ks})
    return metrics, episodes


def format_metrics(metrics: Mapping[str, float]) -> str:
    """A short human-readable summary: pass@k / acc@k rows, the return and the scheme distribution."""
    lines = []
    for prefix in ("pass@", "acc@"):
        row = [f"{key.removeprefix('eval/')} {v:.4f}" for key, v in metrics.items() if key.startswith("eval/" + prefix)]
        if row:
            lines.append("  ".join(row))
    lines.append(f"return {metrics.get('eval/return', float('nan')):.4f}")
    schemes = {key.removeprefix("eval/env/scheme/"): v for key, v in metrics.items() if key.startswith("eval/env/scheme/")}
    if schemes:
        lines.append("schemes: " + "  ".join(f"{name} {v:.2f}" for name, v in schemes.items()))
    return "\n".join(lines)
