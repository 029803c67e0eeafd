"""LLM critics of the actor-critic family (CoLLM, Sections 3.2 and 4.1, Appendix B, E.3).

A critic is the team's base model with a LoRA adapter of its own and a scalar value head read at
the last token of its input (the hidden state after the final norm). It lives in the same
``PeftModel`` as the agents, as one more named adapter, so a centralized critic costs an adapter and
a head, not a model copy; a critic may name another base instead (``CriticSpec.base``: a copy of its own,
unless LoRA agents hold that base, whose ``PeftModel`` it then joins).

What a critic reads (its input is a chat, encoded with the critic base's chat template):

``centralized``   one critic on the joint history h_t: every agent's dialog (its prompts and
                  responses so far, labelled with the agent's role), then the global information m_t;
``decentralized`` one critic per agent on that agent's own history h_{i,t} (its chat as it sees it),
                  then m_t.

The global information m_t is the text of CoLLM, E.3: "You are at turn = {turn} over a
{num_turns}-turn episode. Your last-turn reward is {last_reward} / {reward_max}." (``none`` before
the first turn). ``kind="q"`` adds the joint action a_t (centralized) or the agent's own action
(decentralized) after the history: a Q-critic Q(h_t, a_t) instead of V(h_t).

``share_agent_adapter`` (decentralized only) is the parameter-sharing variant of Appendix B: critic i
reads through agent i's own adapter and only its head is separate, so the actor and critic losses
both move that adapter (the paper warns of gradient interference).

In a team of several bases (agents with their own ``base``) the centralized critic lives on agent 0's base
(``critic_spec.base`` picks another) and decentralized critic i on agent i's, the base whose model it
values. A critic's input is text (the agents' dialogs, rendered), encoded with its own base's tokenizer and
chat template, so agents of other vocabularies need nothing more (docs/models.md, "Teams of several
architectures").

A critic of a full-parameter agent (``finetune: full``, :mod:`collab.policy.full`) reads that agent's untrained base:
its adapter joins the ``PeftModel`` of the LoRA agents on the same base name, or, when none shares it, a copy of the
base of the critic's own (as with ``CriticSpec.base``), never the agent's trained weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from collab.envs.base import Env, EnvState, Message
from collab.errors import require
from collab.policy.adapters import is_peft, recompute_with_forward_adapters, train_adapters_only

MODES = ("centralized", "decentralized")
KINDS = ("v", "q")
CRITIC_SYSTEM = (
    "You are the critic of a team of {n} collaborating agents. Read the dialog and the global "
    "information, and judge how well the team is doing."
)
GLOBAL_INFO = (
    "You are at turn = {turn} over a {num_turns}-turn episode.\nYour last-turn reward is {last_reward} / {reward_max}."
)


@dataclass
class CriticLora:
    r: int
    alpha: int
    target_modules: list[str]


@dataclass
class CriticSpec:
    """How the critics are built: ``model.critic_spec``, each field's meaning and value in ``conf/algo/collm_cc.yaml``
    (no defaults here: a partial ``critic_spec`` keeps the other fields from there)."""

    base: str | None
    lora: CriticLora
    lr: float | None
    kind: str
    global_info: bool
    share_agent_adapter: bool
    context: int | None


def packaged_spec(**changes) -> CriticSpec:
    """``conf/algo/collm_cc.yaml``'s critics (``model.critic_spec``) with ``changes``: the spec of critics built
    without a run's config (a test, a benchmark)."""
    from collab.config import packaged_config

    spec = {**packaged_config("collm_cc")["model"]["critic_spec"], **changes}
    return CriticSpec(**{**spec, "lora": CriticLora(**spec["lora"])})


def check_critic_spec(spec: CriticSpec, option: str = "model.critic_spec") -> None:
    """The critics' settings in range (a UserError naming the option)."""
    from collab.policy.models import check_name
    from collab.policy.specs import check_lora

    require(spec.kind in KINDS, f"unknown critic kind {spec.kind!r} ({option}.kind); valid: {', '.join(KINDS)}")
    require(
        spec.context is None or spec.context >= 8, f"{option}.context must be >= 8 tokens or null, got {spec.context}"
    )
    require(
        spec.lr is None or (spec.lr > 0 and spec.lr != float("inf")),
        f"{option}.lr must be > 0, or null for model.critic_lr, got {spec.lr}",
    )
    check_lora(spec.lora, f"{option}.lora")
    if spec.base is not None:
        check_name(spec.base)
    require(
        not spec.share_agent_adapter or spec.base is None,
        f"{option}.share_agent_adapter reads through an agent's adapter, so it shares its base: set {option}.base null",
    )


# -- inputs ------------------------------------------------------------------------------------------
def global_info(state: EnvState, num_turns: int, reward_max: float | None, agent: int | None = None) -> str:
    """CoLLM E.3's m_t for ``state``: the turn index, the turn limit, the last-turn reward.

    The reward shown is agent ``agent``'s (a decentralized critic), or the team's mean (``None``: the
    centralized critic, which learns the mean); identical under a joint reward.
    """
    rewards = state.memory.get("last_rewards")
    if rewards:
        last = rewards[agent] if agent is not None else sum(rewards) / len(rewards)
    else:
        last = state.memory.get("last_reward")
    last_text = "none" if last is None else f"{float(last):.3f}"
    max_text = "unknown" if reward_max is None else f"{float(reward_max):g}"
    return GLOBAL_INFO.format(turn=state.turn, num_turns=num_turns, last_reward=last_text, reward_max=max_text)


def render(messages: Sequence[Message]) -> str:
    """An agent's dialog as text: its prompts and responses (system prompts left out)."""
    names = {"user": "Prompt", "assistant": "Response"}
    return "\n\n".join(
        f"[{names.get(m['role'], m['role'])}]\n{m['content']}" for m in messages if m["role"] != "system"
    )


def centralized_input(
    state: EnvState,
    roles: Sequence[str],
    num_turns: int,
    reward_max: float | None,
    actions: Sequence[str] | None = None,
    with_global_info: bool = True,
) -> list[Message]:
    """The joint history h_t (every agent's dialog), optionally the joint action, then m_t."""
    parts = [f"## Agent {i + 1} ({role})\n{render(h)}" for i, (role, h) in enumerate(zip(roles, state.histories))]
    if actions is not None:
        parts += [f"## Agent {i + 1} ({role}) now responds\n{a}" for i, (role, a) in enumerate(zip(roles, actions))]
    if with_global_info:
        parts.append(global_info(state, num_turns, reward_max))
    return [
        {"role": "system", "content": CRITIC_SYSTEM.format(n=len(roles))},
        {"role": "user", "content": "\n\n".join(parts)},
    ]


def decentralized_input(
    state: EnvState,
    agent: int,
    num_turns: int,
    reward_max: float | None,
    action: str | None = None,
    with_global_info: bool = True,
) -> list[Message]:
    """Agent ``agent``'s own history h_{i,t} as its chat, optionally its action, then m_t."""
    messages = [dict(m) for m in state.histories[agent]]
    extra = []
    if action is not None:
        extra.append(f"[Your response]\n{action}")
    if with_global_info:
        extra.append(global_info(state, num_turns, reward_max, agent))
    if extra:
        messages[-1] = {**messages[-1], "content": messages[-1]["content"] + "\n\n" + "\n\n".join(extra)}
    return messages


# -- the critics -------------------------------------------------------------------------------------
class ValueHead(nn.Module):
    """A linear value head on the last token's hidden state; starts at V = 0 (zero weights and bias)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.linear(hidden.to(self.linear.weight.dtype)).squeeze(-1)


class Critics(nn.Module):
    """One centralized critic or one critic per agent, over the team's base(s)."""

    def __init__(self, team, env: Env, mode: str, spec: CriticSpec) -> None:
        super().__init__()
        from peft import get_peft_model

        from collab.policy.pool import Base, load_base
        from collab.policy.targets import lora_config

        require(mode in MODES, f"unknown critic mode {mode!r}; valid: {', '.join(MODES)}")
        check_critic_spec(spec)
        require(
            not spec.share_agent_adapter or mode == "decentralized",
            "model.critic_spec.share_agent_adapter is the decentralized variant (Appendix B); use it with "
            "decentralized critics",
        )
        self.team, self.env, self.mode, self.spec = [team], env, mode, spec  # list: not a registered submodule
        self.roles = [s.role for s in team.specs]
        n = 1 if mode == "centralized" else len(team)
        self.own = nn.ModuleDict()  # the models of the critics' own bases: CriticSpec.base, or a full agent's
        self.bases: list[Base] = []  # each critic's base: the agents' (the team's pool) or one of its own
        self.names, self.keys = [], []

        def lora(base: Base, name: str) -> None:  # the critic's LoRA on ``base`` (its target names resolved there)
            config = lora_config(base.layers, spec.lora, "model.critic_spec.lora.target_modules", base.name)
            if is_peft(base.model):
                base.model.add_adapter(name, config)
            else:
                base.model = get_peft_model(base.model, config, adapter_name=name)

        for j in range(n):
            agent = 0 if mode == "centralized" else j
            if spec.share_agent_adapter:
                require(
                    team.agents[j].adapter is not None,
                    f"model.critic_spec.share_agent_adapter reads through agent {j}'s LoRA adapter, but agent {j} "
                    "trains its whole base (finetune: full): set share_agent_adapter false",
                )
                name, base = team.names[j], team.agents[j].base
            else:
                name = f"critic{j}"
                base = team.pool.lora_base(spec.base) if spec.base else team.agents[agent].reference
                if base is None or base.full:  # its own: CriticSpec.base that no LoRA agent holds, or a full agent's
                    base_name, key = (spec.base, "critic_base") if spec.base else (base.name, f"critic_{base.key}")
                    mine = [b for b in self.bases if b.key in self.own and b.name == base_name]
                    base = mine[0] if mine else load_base(key, base_name, team.base_config)
                lora(base, name)  # one more adapter on the agents' base, or on its own
                if base not in team.pool.bases:
                    self.own[base.key] = base.model
            self.names.append(name)
            self.bases.append(base)
            self.keys.append(base.key)
        for model in list(team.models.values()) + list(self.own.values()):
            train_adapters_only(model)
        if team.base_config.gradient_checkpointing:  # a critic's own base: recomputed with its forward's adapter too
            for model in self.own.values():
                recompute_with_forward_adapters(model)
        self.heads = nn.ModuleList(ValueHead(self.model(j).config.hidden_size) for j in range(n))

    def __len__(self) -> int:
        return len(self.names)

    def model(self, j: int):
        return self.bases[j].model

    def tokenizer(self, j: int):
        return self.bases[j].tokenizer

    def parameters_of(self, j: int) -> list[nn.Parameter]:
        """Critic j's trainable parameters: its adapter (unless shared with an agent) and its head."""
        head = list(self.heads[j].parameters())
        if self.spec.share_agent_adapter:
            return head
        tag = f".{self.names[j]}."
        return [p for n, p in self.model(j).named_parameters() if "lora_" in n and tag in n] + head

    # -- inputs ------------------------------------------------------------------------------------
    def inputs(
        self, state: EnvState, actions: Sequence[str] | None = None, critic: int | None = None
    ) -> list[tuple[int, list[Message]]]:
        """``(critic index, chat)`` of every critic that values ``state`` (one if centralized, n if not), or of
        critic ``critic`` alone."""
        env, spec = self.env, self.spec
        acts = actions if spec.kind == "q" else None
        if self.mode == "centralized":
            return [(0, centralized_input(state, self.roles, env.horizon, env.reward_max, acts, spec.global_info))]
        return [
            (i, decentralized_input(state, i, env.horizon, env.reward_max, acts[i] if acts else None, spec.global_info))
            for i in (range(len(self)) if critic is None else [critic])
        ]

    # -- values ------------------------------------------------------------------------------------
    def values(self, critic: Sequence[int], chats: Sequence[Sequence[Message]]) -> Tensor:
        """Value of each chat under its critic, with gradients (float32, shape ``[len(chats)]``)."""
        from collab.policy.adapters import eval_mode
        from collab.policy.lora_batch import per_row_forward
        from collab.policy.models import encode_chat
        from collab.policy.prefixes import pad_left

        device = self.heads[0].linear.weight.device
        if not chats:
            return torch.zeros(0, device=device)
        rows = [None] * len(chats)
        for key in dict.fromkeys(self.keys):
            idx = [b for b, j in enumerate(critic) if self.keys[j] == key]
            if not idx:
                continue
            j0 = critic[idx[0]]
            model, tokenizer = self.model(j0), self.tokenizer(j0)
            seqs = [encode_chat(tokenizer, chats[b])[-(self.spec.context or 0) :] for b in idx]
            input_ids, mask, positions = pad_left(seqs, tokenizer.pad_token_id, device)
            inputs = dict(
                input_ids=input_ids,
                attention_mask=mask,
                position_ids=positions,
                output_hidden_states=True,
                logits_to_keep=1,
            )
            names = [self.names[critic[b]] for b in idx]
            if model.training and self.team[0].base_config.gradient_checkpointing:
                hidden = _checkpointed_last_hidden(model, names, inputs)
            else:
                with eval_mode(model):  # mixed-adapter forward (no dropout in critics): exact in eval mode
                    hidden = per_row_forward(model)(names, **inputs).hidden_states[-1][:, -1]
            for r, b in enumerate(idx):
                rows[b] = self.heads[critic[b]](hidden[r])
        return torch.stack(rows).float()

    def state_values(
        self, states: Sequence[EnvState], actions: Sequence[Sequence[str]] | None = None, critic: int | None = None
    ) -> Tensor:
        """``[len(states), len(self)]``: every critic's value of every state (with gradients); ``[len(states), 1]``:
        critic ``critic``'s alone."""
        pairs = [p for k, s in enumerate(states) for p in self.inputs(s, actions[k] if actions else None, critic)]
        values = self.values([j for j, _ in pairs], [chat for _, chat in pairs])
        return values.view(len(states), len(self) if critic is None else 1)


def _checkpointed_last_hidden(model, names: list[str], inputs: dict) -> Tensor:
    """Last-token hidden states in train mode, where gradient checkpointing applies: one forward per
    adapter (``set_adapter``), since the mixed-adapter path needs eval mode."""
    hidden = [None] * len(names)
    for name in dict.fromkeys(names):
        rows = [r for r, n in enumerate(names) if n == name]
        model.set_adapter(name)
        out = model(**{k: (v[rows] if isinstance(v, Tensor) else v) for k, v in inputs.items()})
        for r, h in zip(rows, out.hidden_states[-1][:, -1]):
            hidden[r] = h
    train_adapters_only(model)  # set_adapter() left only the last active adapter trainable
    return torch.stack(hidden)
