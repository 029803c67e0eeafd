"""Agent teams: several LoRA-adapted policies over shared base models.

Each agent is a named peft LoRA adapter (``agent0``, ``agent1``, ...). Agents whose specs name the same
base share one copy of its weights (one ``PeftModel`` holding all their adapters); a heterogeneous team
has one ``PeftModel`` per distinct base. The reference policy of every agent is its base with adapters
disabled, so a KL penalty needs no extra model.

The policy of agent ``i`` is ``softmax(logits / temperature_i)``, restricted to the agent's closed action
vocabulary when its environment role has one (``choices``). Behaviour log-probs returned by
:meth:`AgentTeam.generate` and the teacher-forced log-probs of :meth:`AgentTeam.logprobs` are both
taken under that distribution, so the importance ratio ``rho = pi / pi_old`` is exactly 1 before the
first update. ``top_p``/``top_k`` truncation is applied when sampling only (as in TRL and the
reference code); with truncation the behaviour log-probs still use the untruncated policy.
"""

from __future__ import annotations

import json
import math
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from collab.errors import UserError, require
from collab.policy.models import (TINY, BaseConfig, checkpointing_enable, encode_chat, load_model, load_tokenizer,
                                  model_folder)
from collab.policy.prefill import per_row_forward
from collab.policy.sampling import Completion, GenerationRequest, decode
from collab.policy.targets import ALL_LINEAR, Layers, in_layer, lora_config, model_layers


@dataclass
class LoraSpec:
    """LoRA adapter hyper-parameters (peft ``LoraConfig``)."""

    r: int = 8
    """Rank of the update."""
    alpha: int = 16
    """Scaling numerator: the update is scaled by alpha / r."""
    dropout: float = 0.0
    """Dropout on the adapter input. Non-zero values turn off mixed-adapter training forwards."""
    target_modules: list[str] = field(default_factory=lambda: [ALL_LINEAR])
    """The layers that get an adapter: layer names (the last part of a module's path, as peft matches them), or
    ``all-linear`` (the default): every linear layer of the decoder, whatever the architecture calls it
    (:func:`lora_targets`)."""


@dataclass
class SamplingSpec:
    """How an agent samples its responses."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0 disables top-k."""
    max_new_tokens: int | None = None
    """``None``: the environment role's suggestion (else 128)."""


@dataclass
class AgentSpec:
    """One agent of a team. Empty fields are filled from the environment's role for the agent."""

    role: str = ""
    system_prompt: str | None = None
    base: str | None = None
    """A base model name; ``None``: the team's default base."""
    lora: LoraSpec = field(default_factory=LoraSpec)
    sampling: SamplingSpec = field(default_factory=SamplingSpec)
    lr: float | None = None
    """This agent's learning rate; ``None``: the algorithm's ``agent_lr``."""
    choices: list[str] | None = None
    """Closed action vocabulary (one token each); filled from the environment role."""


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_lora(lora, where: str) -> None:
    """LoRA settings peft would refuse (or train nothing with), as one-line UserErrors naming the option."""
    require(isinstance(lora.r, int) and not isinstance(lora.r, bool) and lora.r >= 1,
            f"{where}.r (the LoRA rank) must be an integer >= 1, got {lora.r!r}")
    require(_number(lora.alpha) and lora.alpha > 0, f"{where}.alpha must be > 0 (the update is scaled by alpha / r), "
            f"got {lora.alpha!r}")
    dropout = getattr(lora, "dropout", 0.0)
    require(_number(dropout) and 0 <= dropout < 1, f"{where}.dropout must be in [0, 1), got {dropout!r}")
    modules = lora.target_modules
    require(isinstance(modules, (list, tuple)) and len(modules) > 0 and all(isinstance(m, str) and m for m in modules),
            f"{where}.target_modules must be a non-empty list of layer names (e.g. [all-linear] or [q_proj, v_proj]), "
            f"got {modules!r}")


def check_agents(agents: list[AgentSpec] | None, option: str = "model.agents") -> None:
    """Every agent's LoRA, sampling and learning-rate settings in range; a UserError naming the first bad one
    (``model.agents[1].sampling.top_p must be in (0, 1] ...``)."""
    for i, spec in enumerate(agents or []):
        where = f"{option}[{i}]"
        check_lora(spec.lora, f"{where}.lora")
        s = spec.sampling
        require(_number(s.temperature) and s.temperature >= 0,
                f"{where}.sampling.temperature must be >= 0 (0: greedy), got {s.temperature!r}")
        require(_number(s.top_p) and 0 < s.top_p <= 1, f"{where}.sampling.top_p must be in (0, 1] (1: off), got {s.top_p!r}")
        require(isinstance(s.top_k, int) and s.top_k >= 0, f"{where}.sampling.top_k must be an integer >= 0 (0: off), "
                f"got {s.top_k!r}")
        require(s.max_new_tokens is None or (isinstance(s.max_new_tokens, int) and s.max_new_tokens >= 1),
                f"{where}.sampling.max_new_tokens must be >= 1 or null (the role's default), got {s.max_new_tokens!r}")
        require(spec.lr is None or (_number(spec.lr) and spec.lr > 0),
                f"{where}.lr must be > 0, or null for model.agent_lr, got {spec.lr!r}")
        require(spec.choices is None or (len(spec.choices) > 0 and all(isinstance(c, str) and c for c in spec.choices)),
                f"{where}.choices must be a non-empty list of actions or null, got {spec.choices!r}")


class AgentTeam(nn.Module):
    """n agents as LoRA adapters over shared bases."""

    def __init__(self, agents: list[AgentSpec], base: BaseConfig = BaseConfig()) -> None:
        super().__init__()
        from peft import get_peft_model

        if not agents:
            raise UserError("a team needs at least one agent")
        check_agents(agents)
        self.specs = list(agents)
        self.base_config = base
        self.names = [f"agent{i}" for i in range(len(agents))]
        self.base_of: list[str] = []  # agent -> key into self.models
        self.models = nn.ModuleDict()
        self.tokenizers: dict[str, Any] = {}
        self.base_names: dict[str, str] = {}
        """Each base's name (``model.base.name`` or an agent's ``base``)."""
        self.layers: dict[str, Layers] = {}
        """Each base's linear layers by role (:func:`model_layers`), as loaded (before any adapter)."""
        bases: dict[str, str] = {}
        for i, (name, spec) in enumerate(zip(self.names, self.specs)):
            base_name = spec.base or base.name
            model = None
            if base_name not in bases:
                key = f"base{len(bases)}"
                bases[base_name] = key
                self.base_names[key] = base_name
                self.tokenizers[key] = load_tokenizer(base_name)
                model = load_model(BaseConfig(**{**asdict(base), "name": base_name}))
                self.layers[key] = model_layers(model)
            key = bases[base_name]
            self.base_of.append(key)
            option, where = f"model.agents[{i}].lora.target_modules", f"{base_name} ({self._architecture(key, model)})"
            lora = lora_config(self.layers[key], spec.lora, option, where)
            try:
                if model is not None:
                    self.models[key] = get_peft_model(model, lora, adapter_name=name)
                else:
                    self.models[key].add_adapter(name, lora)
            except ValueError as e:  # a name peft cannot adapt (a norm, a whole block)
                layers = self.layers[key]
                raise UserError(f"{option}: {str(e).splitlines()[0]}; the linear layers of {where}: "
                                f"{' '.join(layers.names(layers.linear + layers.head))}") from None
        for model in self.models.values():
            train_adapters_only(model)
            if base.gradient_checkpointing:
                recompute_with_forward_adapters(model)
        self.choice_ids = [self._choice_ids(i) for i in range(len(agents))]
        self.engine = None
        """``None``: :meth:`generate` decodes with collab's own loop; a :class:`~collab.policy.vllm_engine.VllmEngine`:
        it hands generation to vLLM (``--model.engine vllm``)."""
        self.turn_agents: list[list[int]] | None = None
        """``turn_agents[t][i]``: the agent that plays role i at turn t (turns past the list use its last
        row); ``None``: agent i plays role i at every turn."""
        self.decode_memory: int | None = None
        """Bytes of KV cache one decoding batch may hold (rows x (longest prompt + longest response) tokens, at
        the bytes a token takes on its base: :meth:`cache_bytes_per_token`); the requests of a :meth:`generate`
        call that need more are decoded in consecutive parts, each at most this size (a request's n samples
        stay together). ``None``: one batch per base. Set from ``--model.decode_memory_gb``."""
        self._cache_bytes: dict[str, float] = {}
        self.decode_parts_seen = 0
        """Generate calls decoded in more than one part so far (the first prints a line saying so)."""

    # -- structure ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.specs)

    @property
    def device(self) -> torch.device:
        return next(iter(self.models.values())).get_input_embeddings().weight.device

    def acting(self, turn: int, role: int) -> int:
        """The agent that plays environment role ``role`` at turn ``turn`` (see :attr:`turn_agents`)."""
        if self.turn_agents is None:
            return role
        return self.turn_agents[min(turn, len(self.turn_agents) - 1)][role]

    def _architecture(self, key: str, model=None) -> str:
        """The class name of base ``key``'s transformers model (``LlamaForCausalLM``)."""
        model = model if model is not None else self.models[key].get_base_model()
        return type(model).__name__

    def targets_report(self) -> str:
        """What LoRA adapts on each base, one line per base (per distinct target set when its agents differ):
        ``LoRA targets (base0, LlamaForCausalLM): q_proj k_proj v_proj o_proj gate_proj up_proj down_proj
        (30 layers x 7)``, and for a mixture of experts what is not adapted (:func:`lora_targets`). Printed
        once at the start of a run."""
        from peft.tuners.lora import LoraLayer

        lines = []
        for key, model in self.models.items():
            agents = [i for i in range(len(self)) if self.base_of[i] == key]
            adapted: dict[tuple[str, ...], list[int]] = {}
            for i in agents:
                paths = [p for p, m in model.get_base_model().named_modules()
                         if isinstance(m, LoraLayer) and self.names[i] in m.lora_A]
                adapted.setdefault(tuple(paths), []).append(i)
            for paths, who in adapted.items():
                names = list(dict.fromkeys(p.rsplit(".", 1)[-1] for p in paths))
                per_layer: dict[str, int] = {}
                for p in paths:
                    block = p[: len(p) - len(in_layer(p))]
                    per_layer[block] = per_layer.get(block, 0) + 1
                counts = set(per_layer.values())
                size = f"{len(per_layer)} layers x {counts.pop()}" if len(counts) == 1 else f"{len(paths)} modules"
                label = key + ("" if len(adapted) == 1 else ", " + " ".join(self.names[i] for i in who))
                line = f"LoRA targets ({label}, {self._architecture(key)}): {' '.join(names)} ({size})"
                layers = self.layers[key]
                if layers.experts:
                    routers = " ".join(dict.fromkeys(in_layer(p) for p in layers.routers))
                    experts = " ".join(dict.fromkeys(in_layer(p) for p in layers.experts))
                    kind = "" if layers.expert_linear else " (3-D parameters)"
                    line += f"; not adapted: routers {routers}, experts {experts}{kind}"
                lines.append(line)
        return "\n".join(lines)

    def model_of(self, agent: int):
        return self.models[self.base_of[agent]]

    def tokenizer_of(self, agent: int):
        return self.tokenizers[self.base_of[agent]]

    def freeze(self, agents: list[int]) -> None:
        """Keep the adapters of ``agents`` as they are: no gradient, whatever adapter switches later do (peft's
        ``set_adapter`` makes the active adapter trainable; :func:`train_adapters_only` leaves these frozen)."""
        for agent in agents:
            model = self.model_of(agent)
            model.collab_frozen = {*getattr(model, "collab_frozen", ()), self.names[agent]}
        for model in self.models.values():
            train_adapters_only(model)

    def is_frozen(self, agent: int) -> bool:
        """Whether :meth:`freeze` froze ``agent``'s adapter."""
        return self.names[agent] in getattr(self.model_of(agent), "collab_frozen", ())

    def adapter_parameters(self, agent: int) -> list[nn.Parameter]:
        """The trainable LoRA parameters of one agent."""
        tag = f".{self.names[agent]}."
        return [p for n, p in self.model_of(agent).named_parameters() if "lora_" in n and tag in n]

    def _choice_ids(self, agent: int) -> Tensor | None:
        choices = self.specs[agent].choices
        if not choices:
            return None
        tokenizer = self.tokenizer_of(agent)
        ids = []
        for choice in choices:
            tokens = tokenizer.encode(choice, add_special_tokens=False)
            if len(tokens) != 1:
                raise UserError(f"action choice {choice!r} is {len(tokens)} tokens for this tokenizer; choices must be single tokens")
            ids.append(tokens[0])
        return torch.tensor(ids)

    # -- prompts -----------------------------------------------------------------------------------
    def encode(self, agent: int, messages) -> list[int]:
        """Token ids of an agent's chat history, ending with the assistant turn's header."""
        return encode_chat(self.tokenizer_of(agent), messages)

    # -- acting ------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, requests: list[GenerationRequest], max_new_tokens: int = 128) -> list[list[Completion]]:
        """Sample ``request.n`` responses for every request; one decoding loop per distinct base.

        All agents and all samples on a base share one batch (rows carry their adapter names; parts of at
        most :attr:`decode_memory` of KV cache when they need more: :meth:`decode_parts`), and
        the prompt of each request is prefilled once and its KV cache repeated for its n samples.
        With an :attr:`engine`, vLLM samples and the behaviour log-probs are this model's.
        """
        if self.engine is not None:
            return self.engine.generate(self, requests, max_new_tokens)
        results: list[list[Completion] | None] = [None] * len(requests)
        for key, model in self.models.items():
            mine = [i for i, r in enumerate(requests) if self.base_of[r.agent] == key]
            if not mine:
                continue
            rows = [requests[i] for i in mine]
            settings = []
            for r in rows:
                s = self.specs[r.agent].sampling
                settings.append((s.temperature, s.top_p, s.top_k, s.max_new_tokens or max_new_tokens, self.choice_ids[r.agent]))
            was_training = model.training
            model.eval()
            try:
                for part in self.decode_parts(key, rows, settings):
                    outs = decode(model, self.tokenizers[key], [rows[j] for j in part],
                                  [self.names[rows[j].agent] for j in part], [settings[j] for j in part])
                    for j, out in zip(part, outs):
                        results[mine[j]] = out
            finally:
                model.train(was_training)
        return results  # type: ignore[return-value]

    def decode_parts(self, key: str, rows: list[GenerationRequest], settings) -> list[list[int]]:
        """The requests ``rows`` on base ``key`` (positions in ``rows``) in parts whose KV cache fits
        :attr:`decode_memory`: one part, in order, when they all fit.

        A part's cache holds its samples (each request's ``n``) x (its longest prompt + its longest response
        limit) tokens, as :func:`~collab.policy.sampling.decode` pads them. When they do not all fit, the
        requests are first ordered by agent and prompt, so that prompts sharing a start (a tree's histories,
        whose prompts begin alike) land in the same part and prefill that start once
        (:func:`~collab.policy.prefill.prefill`), then cut into consecutive parts. Decoding in parts samples
        from the same policy; the random draws of the rows differ from one batch's (each part draws for its
        own rows)."""
        if self.decode_memory is None:
            return [list(range(len(rows)))] if rows else []
        from collab.training.memory import token_budget_chunks

        lengths = [len(r.prompt_ids) + (1 if s[4] is not None else s[3]) for r, s in zip(rows, settings)]
        budget = max(1, int(self.decode_memory // self.cache_bytes_per_token(key)))
        need = sum(r.n for r in rows) * max(lengths, default=0)  # the padded tokens of one batch
        if need <= budget:
            return [list(range(len(rows)))] if rows else []
        order = sorted(range(len(rows)), key=lambda j: (rows[j].agent, rows[j].prompt_ids))
        parts = [[order[j] for j in part] for part in
                 token_budget_chunks([lengths[j] for j in order], budget, [rows[j].n for j in order])]
        if len(parts) > 1:
            if self.decode_parts_seen == 0:
                import sys

                print(f"decoding in parts: {sum(r.n for r in rows)} samples x {max(lengths)} tokens of KV cache "
                      f"({need * self.cache_bytes_per_token(key) / 2**30:.2f} GiB) is over --model.decode_memory_gb "
                      f"({self.decode_memory / 2**30:.2f} GiB): {len(parts)} parts", file=sys.stderr, flush=True)
            self.decode_parts_seen += 1
        return parts

    def cache_bytes_per_token(self, key: str) -> float:
        """Bytes of KV cache one token takes on base ``key`` (every layer's keys and values), measured once on
        a probe prompt of 8 tokens: exact for any architecture's cache layout and dtype."""
        if key not in self._cache_bytes:
            from collab.policy.prefill import cache_key, prefill

            model, probe = self.models[key], list(range(10, 18))
            agent = self.base_of.index(key)
            was_training = model.training
            model.eval()
            try:
                with torch.no_grad():
                    out, _, _ = prefill(model, [probe], [self.names[agent]], self.tokenizers[key].pad_token_id,
                                        model.get_input_embeddings().weight.device)
            finally:
                model.train(was_training)
            layers = [layer for layer in out[cache_key()].layers if getattr(layer, "keys", None) is not None]
            self._cache_bytes[key] = sum(layer.keys.nbytes + layer.values.nbytes for layer in layers) / len(probe)
        return self._cache_bytes[key]

    # -- learning ----------------------------------------------------------------------------------
    def logprobs(self, agent: int | list[int], prompt_ids: list[list[int]], completion_ids: list[list[int]],
                 reference: bool = False, entropy: bool = False):
        """Teacher-forced per-token log-probs of each completion given its prompt (with gradients).

        ``agent`` is one agent for all rows or one per row (rows of agents on different bases are
        split by base). The sequence log-prob of CoLLM, Section 4.2 is ``out[b].sum()``.
        ``reference=True`` uses the base with adapters disabled (the reference policy). With
        ``entropy=True`` the result is ``(logprobs, entropies)``: also the per-token entropy of the
        agent's policy (the PPO entropy bonus), from the same forward.
        """
        agents = [agent] * len(prompt_ids) if isinstance(agent, int) else list(agent)
        out: list[Tensor | None] = [None] * len(agents)
        ent: list[Tensor | None] = [None] * len(agents)
        for key in self.models:
            idx = [i for i, a in enumerate(agents) if self.base_of[a] == key]
            if idx:
                res = self._logprobs_on_base(key, [agents[i] for i in idx], [prompt_ids[i] for i in idx],
                                             [completion_ids[i] for i in idx], reference, entropy)
                for i, (r, e) in zip(idx, res):
                    out[i], ent[i] = r, e
        return (out, ent) if entropy else out

    def _logprobs_on_base(self, key, agents, prompts, completions, reference, entropy=False) -> list[tuple[Tensor, Tensor | None]]:
        from contextlib import nullcontext

        from collab.policy.head import hidden_states, output_head
        from collab.policy.prefill import pad_left, shared_prefix_forward, shares_prefixes
        from collab.policy.sampling import action_mask, policy_logits

        model = self.models[key]
        pad = self.tokenizers[key].pad_token_id
        seqs = [list(p) + list(c) for p, c in zip(prompts, completions)]
        # Mixed-adapter forwards need eval mode (peft); they are exact when no agent uses dropout
        # and gradient checkpointing (active in train mode only) is off.
        mixed = not reference and all(self.specs[a].lora.dropout == 0 for a in agents) and not self.base_config.gradient_checkpointing
        groups = [list(range(len(agents)))] if (mixed or reference) else [
            [i for i, a in enumerate(agents) if a == b] for b in sorted(set(agents))
        ]
        result: list[Tensor | None] = [None] * len(agents)
        chunked = output_head(model) is not None  # the head applied in chunks of tokens (collab.policy.head)
        share = shares_prefixes(model)
        for g in groups:
            # Only the completion positions need logits (the vocabulary projection dominates).
            keep = max(len(completions[i]) for i in g) + 1
            with hidden_states(model) if chunked else nullcontext() as head:  # chunked: logits are the hidden states
                if reference:  # the K samples' prompt (and a tree's common history) goes through the model once
                    with adapters_disabled(model):
                        logits = shared_prefix_forward(lambda _, **inputs: model(**inputs), prompts, completions,
                                                       ["reference"] * len(g), pad, self.device, share=share,
                                                       logits_to_keep=keep)[0].logits
                elif mixed:
                    with eval_mode(model):
                        logits = shared_prefix_forward(per_row_forward(model), prompts, completions,
                                                       [self.names[a] for a in agents], pad, self.device, share=share,
                                                       logits_to_keep=keep)[0].logits
                else:
                    input_ids, mask, positions = pad_left([seqs[i] for i in g], pad, self.device)
                    model.set_adapter(self.names[agents[g[0]]])
                    logits = model(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                                   logits_to_keep=keep).logits
            if chunked:
                self._score_hidden(logits, head, g, agents, completions, entropy, result)
                continue
            for j, i in enumerate(g):
                n = len(completions[i])
                a = agents[i]
                step_logits = logits[j, -n - 1:-1].float()
                allowed = action_mask(self.choice_ids[a], step_logits.shape[-1], step_logits.device)
                lp = policy_logits(step_logits, self.specs[a].sampling.temperature, allowed).log_softmax(-1)
                target = torch.as_tensor(completions[i], device=lp.device)
                # -sum p log p over the allowed tokens (masked ones have log p = -inf, p = 0: left out,
                # so that neither the value nor its gradient sees 0 * inf)
                ent = -(lp.exp() * lp.masked_fill(~torch.isfinite(lp), 0.0)).sum(-1) if entropy else None
                result[i] = (lp.gather(-1, target[:, None]).squeeze(-1), ent)
        if not (mixed or reference):
            train_adapters_only(model)  # set_adapter() left only the last active adapter trainable
        return result  # type: ignore[return-value]

    def _score_hidden(self, hidden: Tensor, head, group: list[int], agents: list[int], completions: list[list[int]],
                      entropy: bool, result: list) -> None:
        """The group's per-token log-probs (and entropies) from its final hidden states (row j of ``hidden`` is
        item ``group[j]``), through the output head in chunks (:func:`collab.policy.head.token_logprobs`)."""
        from collab.policy.head import token_logprobs, vocab_size
        from collab.policy.sampling import action_mask

        lengths = [len(completions[i]) for i in group]
        rows = torch.cat([hidden[j, -n - 1:-1] for j, n in enumerate(lengths)])
        device = rows.device
        targets = torch.as_tensor([t for i in group for t in completions[i]], dtype=torch.long, device=device)
        temperature = torch.as_tensor([self.specs[agents[i]].sampling.temperature for i, n in zip(group, lengths)
                                       for _ in range(n)], dtype=torch.float, device=device)
        masks = None
        closed = sorted({agents[i] for i in group if self.choice_ids[agents[i]] is not None})
        if closed:  # closed action vocabularies: one mask per agent, an index per token
            allowed = torch.stack([action_mask(self.choice_ids[a], vocab_size(head), device) for a in closed])
            which = torch.as_tensor([closed.index(agents[i]) if agents[i] in closed else -1
                                     for i, n in zip(group, lengths) for _ in range(n)], dtype=torch.long, device=device)
            masks = (allowed, which)
        logp, ent = token_logprobs(rows, head, targets, temperature, masks, entropy)
        for i, lp, e in zip(group, torch.split(logp, lengths), torch.split(ent, lengths) if entropy else [None] * len(group)):
            result[i] = (lp, e)

    # -- persistence -------------------------------------------------------------------------------
    def save_adapters(self, folder: str | Path) -> None:
        """Write each agent's adapter as a peft folder ``folder/agentI`` (config + safetensors)."""
        for i, name in enumerate(self.names):
            self.save_adapter(i, Path(folder) / name)

    def save_adapter(self, agent: int, out: str | Path) -> None:
        """Write one agent's adapter as a peft folder (what peft, vLLM and :meth:`load_adapters` read). Its
        ``base_model_name_or_path`` is where the base loads from (:func:`~collab.policy.models.model_folder`: a
        hub id or an absolute folder), so that ``AutoPeftModelForCausalLM.from_pretrained(out)`` finds it; the
        random ``tiny`` base has none (null)."""
        import copy

        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        out = Path(out)
        name, model = self.names[agent], self.model_of(agent)
        out.mkdir(parents=True, exist_ok=True)
        state = get_peft_model_state_dict(model, adapter_name=name)
        save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, out / "adapter_model.safetensors")
        config = copy.copy(model.peft_config[name])
        config.base_model_name_or_path = base_location(self.base_names[self.base_of[agent]])
        config.save_pretrained(out)
        (out / "agent.json").write_text(json.dumps(asdict(self.specs[agent]), indent=2))

    def load_adapters(self, folder: str | Path) -> None:
        """Load adapters written by :meth:`save_adapters` (or peft) into the team's agents."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        folder = Path(folder)
        paths = [folder / name / "adapter_model.safetensors" for name in self.names]
        for name, path in zip(self.names, paths):  # all or nothing
            if not path.is_file():
                raise UserError(f"no adapter for {name} in {folder} (expected {path})")
        for i, (name, path) in enumerate(zip(self.names, paths)):
            set_peft_model_state_dict(self.model_of(i), load_file(path), adapter_name=name)


def base_location(name: str) -> str | None:
    """What ``from_pretrained`` loads base ``name`` from: a hub id, or a local folder as an absolute path (None for
    the random ``tiny`` model, which no folder holds)."""
    if name == TINY:
        return None
    folder = model_folder(name)
    return str(Path(folder).resolve()) if Path(folder).exists() else folder


def recompute_with_forward_adapters(model) -> None:
    """Gradient checkpointing of a peft model whose recomputation uses the adapters its forward used.

    A checkpointed layer's forward is recomputed inside the backward, with the modules' state at *that* time. A
    call that computes several agents' log-probs on one base sets each agent's adapter in turn
    (``set_adapter``) before the loss's one backward, so every recomputed layer would run the *last* agent's
    adapter: gradients off by more than their own size (tests/policy/test_team.py). Here every checkpointed
    forward records each LoRA layer's active adapter and disabled flag, and its recomputation runs under them
    (``torch.utils.checkpoint``'s ``context_fn``, non-reentrant)."""
    from contextlib import contextmanager, nullcontext

    from peft.tuners.tuners_utils import BaseTunerLayer

    cache: dict[tuple, list] = {}

    def layers() -> list:  # adapters added later (a critic's) may add LoRA layers
        key = tuple(model.peft_config)
        if key not in cache:
            cache.clear()
            cache[key] = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
        return cache[key]

    @contextmanager
    def as_in_forward(state):
        found = layers()
        saved = [(m._active_adapter, m._disable_adapters) for m in found]
        for m, (active, disabled) in zip(found, state):
            m._active_adapter, m._disable_adapters = active, disabled
        try:
            yield
        finally:
            for m, (active, disabled) in zip(found, saved):
                m._active_adapter, m._disable_adapters = active, disabled

    def context_fn():
        state = [(m._active_adapter, m._disable_adapters) for m in layers()]
        return nullcontext(), as_in_forward(state)

    checkpointing_enable(model.base_model.model, {"use_reentrant": False, "context_fn": context_fn})


def train_adapters_only(model: nn.Module) -> None:
    """Mark every LoRA parameter of ``model`` trainable and everything else frozen (``set_adapter``
    leaves only the active adapter trainable; this restores all of them), except the adapters frozen by
    :meth:`AgentTeam.freeze` (named in the model's ``collab_frozen``)."""
    frozen = [f".{name}." for name in getattr(model, "collab_frozen", ())]
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name and not any(tag in name for tag in frozen))


@contextmanager
def adapters_disabled(model):
    """Run ``model`` (a peft model) as its base alone: peft's ``disable_adapter()``. On exit peft
    re-enables only the active adapter (leaving the others frozen), so every adapter is made
    trainable again."""
    try:
        with model.disable_adapter():
            yield
    finally:
        train_adapters_only(model)


class eval_mode:
    """``with eval_mode(module):`` runs ``module`` in eval mode (no dropout), then restores its mode."""

    def __init__(self, module: nn.Module) -> None:
        self.module, self.was = module, module.training

    def __enter__(self):
        self.module.eval()

    def __exit__(self, *exc):
        self.module.train(self.was)
