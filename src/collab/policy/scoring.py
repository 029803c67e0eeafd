"""Teacher-forced log-probs of a team's completions on one base: the forward of the update.

The rows of a base go through its model in as few forwards as stay exact: every agent's rows in one forward
with per-row adapters (:func:`collab.policy.lora_batch.per_row_forward`) when no agent uses dropout and gradient
checkpointing is off, else one forward per agent; the reference policy is the base with adapters disabled (or the
frozen copy of a full-parameter agent's base: :meth:`~collab.policy.pool.Pool.untrained`). A full agent's
model has no adapters: its rows' adapter names are ignored (:class:`~collab.policy.lora_batch.AdapterRows`).
Each token's log-prob is taken under its agent's policy (temperature and closed action vocabulary:
:func:`collab.policy.sampling.policy_logits`), through the output head in chunks of tokens where the model
allows it (:mod:`collab.policy.head`). A completion may hold tokens its agent did not write (a tool's result that
joined its context within the turn): ``own`` marks the agent's tokens, and only theirs are scored (the others are
context: they go through the forward but have no log-prob, entropy or gradient of their own).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import Tensor

from collab.policy.adapters import adapters_disabled, eval_mode, is_peft, train_adapters_only
from collab.policy.head import token_logprobs, vocab_size
from collab.policy.lora_batch import per_row_forward
from collab.policy.prefixes import pad_left, shared_prefix_forward, shares_prefixes
from collab.policy.sampling import action_mask, policy_logits


def logprobs_on_base(
    team,
    base,
    agents: list[int],
    prompts: list[list[int]],
    completions: list[list[int]],
    reference: bool,
    entropy: bool = False,
    own: list[list[bool] | None] | None = None,
) -> list[tuple[Tensor, Tensor | None]]:
    """Per-token log-probs (and entropies) of the rows of one :class:`~collab.policy.pool.Base` of ``team``:
    ``agents[i]``'s policy (or the reference policy: ``base`` is then the agents'
    :attr:`~collab.policy.pool.Agent.reference`) on ``completions[i]`` given ``prompts[i]``; the pairs in the rows'
    order. ``own[i]``: which of ``completions[i]``'s tokens are the agent's (None: all); a row's tensors then hold its
    own tokens' values only, in order."""
    model = team.pool.untrained(base, team.device) if reference else base.model
    pad = base.tokenizer.pad_token_id
    # Mixed-adapter forwards need eval mode (peft); they are exact when no agent uses dropout
    # and gradient checkpointing (active in train mode only) is off.
    mixed = (
        not reference
        and all(team.specs[a].lora.dropout == 0 for a in agents)
        and not team.base_config.gradient_checkpointing
    )
    groups = (
        [list(range(len(agents)))]
        if (mixed or reference)
        else [[i for i, a in enumerate(agents) if a == b] for b in sorted(set(agents))]
    )
    result: list[Tensor | None] = [None] * len(agents)
    from collab.policy.head import hidden_states, output_head  # looked up at each call: tests patch the head

    chunked = output_head(model) is not None  # the head applied in chunks of tokens (collab.policy.head)
    for g in groups:
        # Only the completion positions need logits (the vocabulary projection dominates).
        keep = max(len(completions[i]) for i in g) + 1
        with hidden_states(model) if chunked else nullcontext() as head:  # chunked: logits are the hidden states
            logits = _forward(team, model, g, agents, prompts, completions, pad, keep, reference, mixed)
        if chunked:
            score_hidden(team, logits, head, g, agents, completions, entropy, result, own)
        else:
            score_logits(team, logits, g, agents, completions, entropy, result, own)
    if not (mixed or reference):
        train_adapters_only(model)  # set_adapter() left only the last active adapter trainable
    return result  # type: ignore[return-value]


def _forward(team, model, group, agents, prompts, completions, pad, keep: int, reference: bool, mixed: bool) -> Tensor:
    """The logits (or, under :func:`~collab.policy.head.hidden_states`, the final hidden states) of the group's rows,
    their last ``keep`` positions: the reference policy (adapters disabled) and a mixed-adapter forward take each
    shared prompt start once (:func:`~collab.policy.prefixes.shared_prefix_forward`; all rows are then one group); an
    agent's own group (dropout, or gradient checkpointing) runs one left-padded pass with its adapter set."""
    share = shares_prefixes(model)
    if reference:  # the K samples' prompt (and a tree's common history) goes through the model once
        with adapters_disabled(model):
            return shared_prefix_forward(
                lambda _, **inputs: model(**inputs),
                prompts,
                completions,
                ["reference"] * len(group),
                pad,
                team.device,
                share=share,
                logits_to_keep=keep,
            )[0].logits
    if mixed:
        with eval_mode(model):
            return shared_prefix_forward(
                per_row_forward(model),
                prompts,
                completions,
                [team.names[a] for a in agents],
                pad,
                team.device,
                share=share,
                logits_to_keep=keep,
            )[0].logits
    seqs = [list(prompts[i]) + list(completions[i]) for i in group]
    input_ids, mask, positions = pad_left(seqs, pad, team.device)
    if is_peft(model):
        model.set_adapter(team.names[agents[group[0]]])
    return model(input_ids=input_ids, attention_mask=mask, position_ids=positions, logits_to_keep=keep).logits


def score_logits(
    team,
    logits: Tensor,
    group: list[int],
    agents: list[int],
    completions: list[list[int]],
    entropy: bool,
    result: list,
    own: list[list[bool] | None] | None = None,
) -> None:
    """The group's per-token log-probs (and entropies) from its logits (row j of ``logits`` is item ``group[j]``),
    each under its agent's policy; only the agent's own tokens (``own``) are kept."""
    for j, i in enumerate(group):
        n = len(completions[i])
        a = agents[i]
        step_logits = logits[j, -n - 1 : -1].float()
        allowed = action_mask(team.choice_ids[a], step_logits.shape[-1], step_logits.device)
        lp = policy_logits(step_logits, team.specs[a].sampling.temperature, allowed).log_softmax(-1)
        target = torch.as_tensor(completions[i], device=lp.device)
        # -sum p log p over the allowed tokens (masked ones have log p = -inf, p = 0: left out,
        # so that neither the value nor its gradient sees 0 * inf)
        ent = -(lp.exp() * lp.masked_fill(~torch.isfinite(lp), 0.0)).sum(-1) if entropy else None
        mine = own[i] if own is not None else None
        if mine is not None:
            keep_rows = torch.as_tensor(mine, dtype=torch.bool, device=lp.device)
            lp, target, ent = lp[keep_rows], target[keep_rows], None if ent is None else ent[keep_rows]
        result[i] = (lp.gather(-1, target[:, None]).squeeze(-1), ent)


def score_hidden(
    team,
    hidden: Tensor,
    head,
    group: list[int],
    agents: list[int],
    completions: list[list[int]],
    entropy: bool,
    result: list,
    own: list[list[bool] | None] | None = None,
) -> None:
    """The group's per-token log-probs (and entropies) from its final hidden states (row j of ``hidden`` is
    item ``group[j]``), through the output head in chunks (:func:`collab.policy.head.token_logprobs`); only the
    agent's own tokens (``own``) go through the head."""
    mine = [own[i] if own is not None else None for i in group]
    rows = [hidden[j, -len(completions[i]) - 1 : -1] for j, i in enumerate(group)]
    tokens = [list(completions[i]) for i in group]
    for j, m in enumerate(mine):
        if m is not None:
            rows[j] = rows[j][torch.as_tensor(m, dtype=torch.bool, device=rows[j].device)]
            tokens[j] = [t for t, keep in zip(tokens[j], m) if keep]
    lengths = [len(t) for t in tokens]
    rows = torch.cat(rows)
    device = rows.device
    targets = torch.as_tensor([t for ts in tokens for t in ts], dtype=torch.long, device=device)
    temperature = torch.as_tensor(
        [team.specs[agents[i]].sampling.temperature for i, n in zip(group, lengths) for _ in range(n)],
        dtype=torch.float,
        device=device,
    )
    masks = None
    closed = sorted({agents[i] for i in group if team.choice_ids[agents[i]] is not None})
    if closed:  # closed action vocabularies: one mask per agent, an index per token
        allowed = torch.stack([action_mask(team.choice_ids[a], vocab_size(head), device) for a in closed])
        which = torch.as_tensor(
            [closed.index(agents[i]) if agents[i] in closed else -1 for i, n in zip(group, lengths) for _ in range(n)],
            dtype=torch.long,
            device=device,
        )
        masks = (allowed, which)
    logp, ent = token_logprobs(rows, head, targets, temperature, masks, entropy)
    entropies = torch.split(ent, lengths) if entropy else [None] * len(group)
    for i, lp, e in zip(group, torch.split(logp, lengths), entropies):
        result[i] = (lp, e)
