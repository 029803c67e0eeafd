"""MADPO: multi-agent direct preference optimization, as the MAGRPO authors' library CoMLRL trains it
(``comlrl/trainers/preference/madpo.py``), on DPO's loss (Rafailov et al. 2023, Eq. 7).

Per training step:

1. Roll out MAGRPO's tree (``collab.rollout.tree``, ``aligned``): at each history every agent draws K responses and
   child k is the joint action of every agent's k-th; its return is the team's (a per-agent reward: the mean
   over the agents).
2. At each history, every ordered pair of children whose returns differ is a candidate preference, the larger
   return preferred (ties give none); ``pair_selection`` orders them (the largest gaps first, as the library) and
   the first ``pairs_per_node`` are kept (:func:`collab.objectives.preference_pairs`).
3. ``ppo.num_epochs`` passes of minibatch updates of the mean over the pairs of -log sigmoid(beta m), with m the
   sum over the agents of log pi_i(y_w^i) - log pi_i(y_l^i) (sequence log-probs: sums over the response's
   tokens), less the reference's with ``reference`` (:func:`collab.objectives.joint_dpo_loss`). Each agent's
   gradient goes through its own log-probs: the library's per-agent loss with the others' held constant.

The library trains offline (its pairs drawn once from the initial policy, then epochs over them) at one turn;
here each step draws its pairs from the current team, and a multi-turn tree gives pairs at every history
(docs/fidelity.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

from collab.algos.base import CollabModule, Term
from collab.algos.groups import PPOOptions
from collab.errors import require, require_ranges
from collab.objectives import PAIR_SELECTIONS, joint_dpo_loss, joint_log_ratios, preference_pairs
from collab.rollout.experience import Batch, Decision, Experience, Normalizers
from collab.rollout.tree import tree_batch


@dataclass
class PreferencePair:
    """Two joint actions drawn at one history: each agent's response of the preferred and of the other."""

    winners: list[Decision]
    """Agent i's response in the joint action with the larger return, in agent order."""
    losers: list[Decision]
    gap: float
    """The return of the winner less the loser's (> 0)."""

    @property
    def tokens(self) -> int:
        """Every response's prompt and completion tokens: its size in a forward pass."""
        return sum(d.tokens for d in self.winners + self.losers)


def node_pairs(
    samples: list[Decision], n_agents: int, selection: str, limit: int | None
) -> tuple[list[PreferencePair], int]:
    """The preference pairs of every history of an aligned tree's samples (``tree_batch``'s order: node by node,
    agent by agent, K samples each, ``group`` counting (node, agent)), and the number of histories."""
    nodes: dict[int, list[list[Decision]]] = {}
    for s in samples:
        nodes.setdefault(s.group // n_agents, [[] for _ in range(n_agents)])[s.agent].append(s)
    pairs = []
    for per_agent in nodes.values():
        k = len(per_agent[0])
        assert all(len(a) == k for a in per_agent), "an aligned tree draws K responses per agent at every history"
        joint = [sum(float(per_agent[i][c].returns) for i in range(n_agents)) / n_agents for c in range(k)]
        for win, lose in preference_pairs(joint, selection, limit):
            pairs.append(
                PreferencePair([a[win] for a in per_agent], [a[lose] for a in per_agent], joint[win] - joint[lose])
            )
    return pairs, len(nodes)


def check_pair_options(pair_selection: str, pairs_per_node: int | None) -> None:
    """``model.pair_selection`` and ``model.pairs_per_node`` in range (MADPO's, and MARLHF's reward model's pairs)."""
    require(
        pairs_per_node is None or (isinstance(pairs_per_node, int) and pairs_per_node >= 1),
        f"model.pairs_per_node must be >= 1 or null, got {pairs_per_node}",
    )
    require_ranges({"pair_selection": pair_selection}, choices={"pair_selection": PAIR_SELECTIONS})
    require(
        pair_selection != "all" or pairs_per_node is None,
        "model.pair_selection all takes every pair: set model.pairs_per_node null (or choose reward_gap | random)",
    )


class MADPO(CollabModule):
    """The options and their meaning: ``conf/algo/madpo.yaml``."""

    passes_per_model = False  # a pair's one sigmoid holds every agent's log-ratio: a pass uses every model

    def __init__(
        self,
        *,
        num_generations: int | None,
        beta: float,
        reference: bool,
        pair_selection: str,
        pairs_per_node: int | None,
        ppo: PPOOptions,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        require(
            num_generations is None or num_generations >= 2,
            f"MADPO needs model.num_generations >= 2 to compare joint actions, got {num_generations}",
        )
        require(beta > 0 and beta != float("inf"), f"model.beta must be > 0, got {beta}")
        check_pair_options(pair_selection, pairs_per_node)
        ppo.check()
        self.k, self.beta, self.reference = num_generations, beta, reference
        self.pair_selection, self.pairs_per_node, self.ppo = pair_selection, pairs_per_node, ppo

    def build_extra(self, env) -> None:
        if self.k is None:
            self.k = getattr(env, "num_generations", 4)

    # -- rollout (step 1) and prepare (step 2) ----------------------------------------------------------
    def rollout(self, tasks) -> Experience[Decision]:
        return tree_batch(self.team, self.env, tasks, self.k, self.ppo.gamma, "aligned", None, self.max_new_tokens)

    @torch.no_grad()
    def prepare(self, experience: Experience[Decision]) -> Batch[PreferencePair]:
        """Each history's preference pairs; a history whose K returns are all equal gives none."""
        pairs, nodes = node_pairs(experience.items, self.env.n_agents, self.pair_selection, self.pairs_per_node)
        gaps = [p.gap for p in pairs]
        return Batch(
            pairs,
            {
                "train/pairs": float(len(pairs)),
                "train/pairs_per_node": len(pairs) / max(nodes, 1),
                "train/reward_gap": sum(gaps) / len(gaps) if gaps else 0.0,
            },
        )

    # -- loss (step 3) ---------------------------------------------------------------------------------
    def terms(self, micro: list[PreferencePair], scale: Normalizers) -> list[Term]:
        """One term: one forward computes every response of the micro-batch's pairs."""
        return [partial(self.preference_loss, micro, scale)]

    def sequence_logprobs(self, micro: list[PreferencePair], reference: bool = False) -> torch.Tensor:
        """Sequence log-probs ``[2, P, n]``: each pair's winners', then its losers', agent by agent."""
        rows = [d for side in ("winners", "losers") for p in micro for d in getattr(p, side)]
        token_logprobs = self.team.logprobs(
            [d.member for d in rows],
            [d.prompt_ids for d in rows],
            [d.completion_ids for d in rows],
            reference=reference,
            own=[d.own for d in rows],
        )
        return torch.stack([t.sum() for t in token_logprobs]).view(2, len(micro), len(micro[0].winners))

    def preference_loss(self, micro: list[PreferencePair], scale: Normalizers) -> tuple[torch.Tensor, dict[str, float]]:
        """The micro-batch's pairs' DPO losses summed and divided by the minibatch's pairs on every rank: over a
        minibatch, the mean over its pairs (CoMLRL's mean over a batch of pairs)."""
        winners, losers = self.sequence_logprobs(micro)
        refs = (None, None)
        if self.reference:
            with torch.no_grad():
                refs = tuple(self.sequence_logprobs(micro, reference=True))
        losses = joint_dpo_loss(winners, losers, self.beta, *refs)
        margins = joint_log_ratios(winners.detach(), losers.detach(), *refs)
        stats = {
            "train/dpo_margin": float(margins.mean()),
            "train/dpo_accuracy": float((margins > 0).float().mean()),
        }
        return losses.sum() / scale.count, stats
