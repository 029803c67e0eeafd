"""The MLP value head on the frozen base: MARFT's central critic (MARFT, Figure 3; hidden -> 1024 -> 512 -> 1 in
its reference code), also MAPoRL's per-agent value heads and the learned verifier's scorer.

The critic is a small MLP on the last-layer hidden state of the *frozen* base model with every
adapter disabled: hidden -> 1024 -> 512 -> 1 (the reference code's sizes). Only the MLP trains. One
head serves every agent (Table 7 "share critic: True"): the value of agent i's decision point is read
at the last token of agent i's observation o^i_t = (profile, s_t, a_t^{1:i-1}), i.e. V(s_t, a_t^{1:i-1}).

Because the base is frozen and read without adapters, an observation's features never change while
the agents learn, so collab computes them once, when the rollout is played, and every PPO epoch
then trains the head on cached features: the critic costs one adapter-free forward per observation
per rollout, and nothing in backward.

Token level (MARFT-T): V(s_t, a_t^{1:i-1}, w^{i,1:j}) is read at every position whose logits choose
a token of agent i's response: the observation's last token and the response's tokens but the last
(the state before token j+1 is chosen), so each generated token has the value of the state it was
chosen in.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from collab.policy.adapters import adapters_disabled, eval_mode, is_peft
from collab.policy.prefixes import pad_left

HIDDEN = (1024, 512)


class CriticHead(nn.Module):
    """MLP value head: hidden -> 1024 -> 512 -> 1, ReLU between layers; the output layer starts at zero
    (V = 0 everywhere before training, so the first advantages are the plain returns)."""

    def __init__(self, hidden_size: int, widths: Sequence[int] = HIDDEN) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = hidden_size
        for w in widths:
            layers += [nn.Linear(width, w), nn.ReLU()]
            width = w
        out = nn.Linear(width, 1)
        nn.init.zeros_(out.weight)
        nn.init.zeros_(out.bias)
        self.net = nn.Sequential(*layers, out)

    def forward(self, features: Tensor) -> Tensor:
        """``features[..., hidden]`` -> values ``[...]`` (float32)."""
        return self.net(features.float()).squeeze(-1)


@torch.no_grad()
def base_features(
    model,
    pad_id: int,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]] | None = None,
    batch_size: int = 8,
) -> list[Tensor]:
    """Last-layer hidden states of the peft ``model``'s frozen base with its adapters disabled (float32, CPU), or of a
    frozen model without adapters (the untrained copy of full agents' base: :mod:`collab.policy.full`).

    Without ``completions``: one ``[hidden]`` vector per prompt, at its last token. With them: one
    ``[len(completion), hidden]`` matrix per row, at the last prompt token and at every completion
    token but the last. Rows go through the model ``batch_size`` at a time.
    """
    device = model.get_input_embeddings().weight.device
    base = model.get_base_model() if is_peft(model) else model
    decoder = getattr(base, base.base_model_prefix)  # the transformer without its LM head
    out: list[Tensor] = []
    with eval_mode(model), adapters_disabled(model):
        for start in range(0, len(prompts), batch_size):
            rows = range(start, min(start + batch_size, len(prompts)))
            tails = [list(completions[r][:-1]) if completions is not None else [] for r in rows]
            seqs = [list(prompts[r]) + t for r, t in zip(rows, tails)]
            ids, mask, positions = pad_left(seqs, pad_id, device)
            hidden = _decoder_output(model, decoder, ids, mask, positions)
            for b, (r, t) in enumerate(zip(rows, tails)):
                if completions is None:
                    out.append(hidden[b, -1].float().cpu())
                elif not completions[r]:  # an empty response has no decision points
                    out.append(hidden.new_zeros((0, hidden.shape[-1])).float().cpu())
                else:
                    out.append(hidden[b, hidden.shape[1] - len(t) - 1 :].float().cpu())
    return out


def _decoder_output(model, decoder, ids: Tensor, mask: Tensor, positions: Tensor) -> Tensor:
    """The decoder's last hidden states; under FSDP2 (:mod:`collab.runtime.lockstep`) through ``model``, the sharded
    root whose hooks gather its weights (the decoder called alone would meet sharded embeddings), the decoder's output
    taken by a forward hook (the LM head's logits are computed and dropped)."""
    from collab.runtime import lockstep

    if lockstep.active() is None:
        return decoder(input_ids=ids, attention_mask=mask, position_ids=positions).last_hidden_state
    seen: list[Tensor] = []
    handle = decoder.register_forward_hook(lambda _m, _a, out: seen.append(out.last_hidden_state))
    try:
        model(input_ids=ids, attention_mask=mask, position_ids=positions)
    finally:
        handle.remove()
    return seen[-1]


def team_features(
    team, members: Sequence[int], prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]
) -> list[Tensor]:
    """:func:`base_features` of each row (member, prompt, completion) on its member's frozen base (a full-parameter
    member's untrained base: :meth:`~collab.policy.team.AgentTeam.untrained`): the hidden state at every position that
    chooses a response token, one batch per distinct base."""
    out: list[Tensor | None] = [None] * len(members)
    bases = [team.agents[m].reference for m in members]
    for base in dict.fromkeys(bases):
        rows = [k for k, b in enumerate(bases) if b is base]
        member = members[rows[0]]
        feats = base_features(
            team.untrained(member),
            team.tokenizer_of(member).pad_token_id,
            [prompts[k] for k in rows],
            [completions[k] for k in rows],
        )
        for k, f in zip(rows, feats):
            out[k] = f
    return out  # type: ignore[return-value]
