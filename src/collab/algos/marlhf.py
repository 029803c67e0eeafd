"""MARLHF: multi-agent RLHF, as the MAGRPO authors' library CoMLRL trains it (``comlrl/trainers/preference/
marlhf.py``): a joint reward model fitted to preference pairs, then MAGRPO on its scores.

Per training step, the first ``reward_rollouts`` steps (the reward model's phase; the agents do not move, so their
pairs come from the initial team, as the library draws its pairs once from it):

1. Roll out MAGRPO's tree (``collab.rollout.tree``, ``aligned``) on the task reward.
2. At each history, MADPO's preference pairs (:func:`collab.objectives.preference_pairs`): two joint actions whose
   team returns differ, the larger preferred, ``pair_selection`` and ``pairs_per_node`` as MADPO's.
3. One update of the reward model on the rollout's pairs: the mean over them of the Bradley-Terry loss
   -log sigmoid(r(h, a_w) - r(h, a_l)) (:func:`collab.objectives.bradley_terry_loss`).

Every step after (the policy's phase): MAGRPO's tree, with every joint action's reward the frozen reward model's
score r(h, a) (each agent's: a joint reward), group-relative advantages over each agent's K siblings (divided by
their std under ``normalize_std``) and MAGRPO's clipped policy gradient (:mod:`collab.algos.magrpo`), plus
``kl_coef`` times each sample's KL to the initial policy (RLHF's penalty; 0 by default). The task's own reward is
logged (``env/task_reward``) and scores the held-out evaluation, as the library evaluates on it.

The reward model is a centralized Q-critic of :mod:`collab.algos.llm_critics` (``kind: q``): an adapter of its own
on the team's base and a linear head on the last token of a chat holding every agent's prompt and response. The
library's is a separate copy of the base trained whole (AdamW at 1e-5, batches of 2 pairs, 1 epoch) with its head on
the last token of its own plain-text layout; here an adapter (no second copy of the weights), collab's critic layout,
and one update per rollout over its pairs, so that ``trainer.max_steps`` counts rollouts as for every algorithm.
The library runs one turn; a longer horizon scores every turn's joint action (docs/fidelity.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

from collab.algos.base import Term
from collab.algos.groups import PPOOptions
from collab.algos.llm_critics import Critics, CriticSpec, check_critic_spec
from collab.algos.madpo import check_pair_options
from collab.algos.magrpo import MAGRPO
from collab.envs.base import EnvState
from collab.errors import require
from collab.objectives import bradley_terry_loss, preference_pairs
from collab.rollout.experience import Batch, Experience, Normalizers
from collab.rollout.tree import TreeNode, backup_returns


@dataclass
class JointPair:
    """Two joint actions drawn at one history: every agent's response in the preferred one and in the other."""

    state: EnvState
    winners: list[str]
    losers: list[str]
    gap: float
    """The team return of the winner less the loser's (> 0)."""
    tokens: int
    """The agents' prompt and response tokens of both joint actions: the pair's size in the reward model's forward."""


def tree_pairs(root: TreeNode, gamma: float, selection: str, limit: int | None) -> list[JointPair]:
    """The preference pairs of every history of ``root``'s tree, ranked by the children's team return (the mean
    over the agents of :func:`~collab.rollout.tree.backup_returns`'s)."""
    backup_returns(root, gamma)
    pairs = []
    for node in root.nodes():
        joint = node.returns.mean(1).tolist()
        actions = [[node.samples[i][j] for i, j in enumerate(c)] for c in node.joints]
        for win, lose in preference_pairs(joint, selection, limit):
            tokens = sum(len(a.prompt_ids) + len(a.completion_ids) for a in actions[win] + actions[lose])
            pairs.append(
                JointPair(
                    node.state,
                    [a.text for a in actions[win]],
                    [a.text for a in actions[lose]],
                    joint[win] - joint[lose],
                    tokens,
                )
            )
    return pairs


class MARLHF(MAGRPO):
    """The options and their meaning: ``conf/algo/marlhf.yaml``."""

    passes_per_model = False  # the reward model's pass reads every agent's response

    def __init__(
        self,
        *,
        num_generations: int | None,
        reward_rollouts: int,
        reward_model: CriticSpec,
        pair_selection: str,
        pairs_per_node: int | None,
        normalize_std: bool,
        kl_coef: float,
        ppo: PPOOptions,
        **kwargs,
    ) -> None:
        super().__init__(  # written out: the command line's parser reads the options a subclass fixes from this call
            num_generations=num_generations,
            joint_mode="aligned",
            baseline="mean",
            normalize_std=normalize_std,
            ppo=ppo,
            kl_coef=kl_coef,
            log_kl_every=0,
            termination_threshold=None,
            termination="branch",
            cross_reduction="mean",
            rollout_mode="tree",
            dependency="none",
            invalid_penalty=0.0,
            **kwargs,
        )
        require(
            isinstance(reward_rollouts, int) and not isinstance(reward_rollouts, bool) and reward_rollouts >= 1,
            f"model.reward_rollouts must be >= 1 (rollouts whose pairs fit the reward model), got {reward_rollouts}",
        )
        require(
            reward_model.kind == "q" and not reward_model.share_agent_adapter,
            "model.reward_model scores a joint action: its kind must be q and share_agent_adapter false",
        )
        require(
            reward_model.lr is not None, "model.reward_model.lr must be > 0, got None"
        )  # no critic_lr to fall back on
        check_critic_spec(reward_model, "model.reward_model")
        check_pair_options(pair_selection, pairs_per_node)
        self.reward_rollouts, self.reward_spec = reward_rollouts, reward_model
        self.pair_selection, self.pairs_per_node = pair_selection, pairs_per_node
        self.reward_model: Critics | None = None

    def build_extra(self, env) -> None:
        super().build_extra(env)
        self.reward_model = Critics(self.team, env, "centralized", self.reward_spec).to(self.team.device)

    def param_groups(self):
        return super().param_groups() + [
            {"params": self.reward_model.parameters_of(0), "lr": self.reward_spec.lr, "name": "reward_model"}
        ]

    def fitting_rewards(self) -> bool:
        """Whether this step belongs to the reward model's phase (the first ``reward_rollouts`` rollouts)."""
        return self.rollouts <= self.reward_rollouts

    def accept(self, stats: dict[str, float], count: int, scale: Normalizers) -> bool:
        """Every update is applied, to the phase's parameters only: under DDP every trainable parameter holds a
        (zero) gradient by now, which would advance the idle ones' AdamW moments and step counts, so that a run would
        depend on its number of processes; without a gradient AdamW leaves them as one process does."""
        optimizer = self.optimizers()
        for group in getattr(optimizer, "optimizer", optimizer).param_groups:
            if (group.get("name") == "reward_model") != self.fitting_rewards():
                for p in group["params"]:
                    p.grad = None
        return True

    def update_shape(self) -> tuple[int, int | None]:
        return (1, None) if self.fitting_rewards() else super().update_shape()

    # -- rollout (step 1) and prepare (step 2) ----------------------------------------------------------
    def rollout(self, tasks) -> Experience:
        """The tree on the task reward, its pairs the items (the reward model's phase); or the tree with every
        joint action scored by the reward model (the policy's)."""
        if not self.fitting_rewards():
            return self.trees(tasks, relabel=self.score)
        pairs: list[JointPair] = []
        gamma, selection, limit = self.ppo.gamma, self.pair_selection, self.pairs_per_node
        experience = self.trees(tasks, relabel=lambda root: pairs.extend(tree_pairs(root, gamma, selection, limit)))
        experience.items = pairs
        return experience

    @torch.no_grad()
    def score(self, root: TreeNode) -> None:
        """Every joint action's reward: the reward model's score, for every agent; the task's is kept in its info."""
        for node in root.nodes():
            joints = [[node.samples[i][j].text for i, j in enumerate(c)] for c in node.joints]
            scores = self.reward_model.state_values([node.state] * len(joints), joints)[:, 0].tolist()
            for c, score in enumerate(scores):
                task = node.rewards[c]
                node.infos[c] = {**node.infos[c], "task_reward": sum(task) / len(task)}
                node.rewards[c] = (score,) * len(task)

    @torch.no_grad()
    def prepare(self, experience: Experience) -> Batch:
        if not self.fitting_rewards():
            return super().prepare(experience)
        gaps = [p.gap for p in experience.items]
        return Batch(
            experience.items,
            {"train/pairs": float(len(gaps)), "train/reward_gap": sum(gaps) / len(gaps) if gaps else 0.0},
        )

    # -- loss (step 3) ---------------------------------------------------------------------------------
    def normalizers(self, minibatch: list, batch: Batch, index: int) -> Normalizers:
        if self.fitting_rewards():  # the pairs of every rank: the loss is their mean
            return super(MAGRPO, self).normalizers(minibatch, batch, index)
        return super().normalizers(minibatch, batch, index)

    def micro_batches(self, minibatch: list) -> list[list[int]]:
        if self.fitting_rewards():
            return super(MAGRPO, self).micro_batches(minibatch)
        return super().micro_batches(minibatch)

    def terms(self, micro: list, scale: Normalizers) -> list[Term]:
        if self.fitting_rewards():
            return [partial(self.reward_model_loss, micro, scale)]
        return super().terms(micro, scale)

    def reward_model_loss(self, micro: list[JointPair], scale: Normalizers) -> tuple[torch.Tensor, dict[str, float]]:
        """The micro-batch's Bradley-Terry losses summed and divided by the pairs of every rank's minibatch."""
        states = [p.state for p in micro for _ in range(2)]
        scores = self.reward_model.state_values(states, [side for p in micro for side in (p.winners, p.losers)])
        scores = scores.view(len(micro), 2)
        losses = bradley_terry_loss(scores[:, 0], scores[:, 1])
        stats = {
            "train/reward_model_loss": float(losses.detach().mean()),
            "train/reward_model_accuracy": float((scores[:, 0] > scores[:, 1]).float().mean()),
        }
        return losses.sum() / scale.count, stats
