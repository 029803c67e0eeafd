"""Agent teams: several LoRA-adapted policies over shared base models, and full-parameter agents beside them.

Each agent is a named peft LoRA adapter (``agent0``, ``agent1``, ...). Agents whose specs name the same
base share one copy of its weights (one ``PeftModel`` holding all their adapters); a heterogeneous team
has one ``PeftModel`` per distinct base. The reference policy of every agent is its base with adapters
disabled, so a KL penalty needs no extra model. An agent with ``finetune: full`` owns a trainable copy of its
whole base instead (:mod:`collab.policy.full`: its reference, memory, saving and what it does not support). The
bases and the agents on them: :mod:`collab.policy.pool` (``team.agents[i].base``, ``team.pool.bases``).

The policy of agent ``i`` is ``softmax(logits / temperature_i)``, restricted to the agent's closed action
vocabulary when its environment role has one (``choices``). Behaviour log-probs returned by
:meth:`AgentTeam.generate` and the teacher-forced log-probs of :meth:`AgentTeam.logprobs` are both
taken under that distribution, so the importance ratio ``rho = pi / pi_old`` is exactly 1 before the
first update. ``top_p``/``top_k`` truncation is applied when sampling only (as in TRL and the
reference code); with truncation the behaviour log-probs still use the untruncated policy. The teacher-forced
forward of one base: :mod:`~collab.policy.scoring`; which adapters train or run: :mod:`~collab.policy.adapters`.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch
from torch import Tensor, nn

from collab.errors import UserError
from collab.policy import full
from collab.policy.adapters import eval_mode, is_peft, recompute_with_forward_adapters, train_adapters_only
from collab.policy.devices import resolve_device
from collab.policy.models import TINY, BaseConfig, encode_chat, model_folder
from collab.policy.pool import Agent, Base, Pool, load_base
from collab.policy.sampling import Completion, GenerationRequest, decode
from collab.policy.scoring import logprobs_on_base
from collab.policy.specs import (
    AgentDefaults,
    AgentSpec,
    LoraSpec,
    SamplingSpec,
    check_agent_defaults,
    check_agents,
    check_lora,
    leaves_out,
    packaged_defaults,
    with_defaults,
)
from collab.policy.targets import lora_config, targets_report
from collab.runtime import lockstep
from collab.runtime.lockstep import whole, whole_state

__all__ = [
    "AgentDefaults",
    "AgentSpec",
    "AgentTeam",
    "LoraSpec",
    "SamplingSpec",
    "base_location",
    "check_agent_defaults",
    "check_agents",
    "check_lora",
    "with_defaults",
]


class AgentTeam(nn.Module):
    """n agents as LoRA adapters over shared bases (or, ``finetune: full``, as trainable copies of their bases). A
    spec's field left out (None) takes ``conf/base.yaml``'s ``model.agent_defaults`` (a module fills its specs from
    its run's block before: :func:`~collab.policy.specs.with_defaults`). ``shards``: the processes fsdp will split
    each model across (the full agents' memory check counts ``1/shards`` of each, :func:`full.check_fits`)."""

    def __init__(self, agents: list[AgentSpec], base: BaseConfig = BaseConfig(), shards: int = 1) -> None:
        super().__init__()
        from peft import get_peft_model

        if not agents:
            raise UserError("a team needs at least one agent")
        check_agents(agents)
        if any(leaves_out(a) for a in agents):  # built in Python: what a spec leaves out is conf/base.yaml's
            defaults = packaged_defaults()
            agents = [with_defaults(a, defaults) if leaves_out(a) else a for a in agents]
        full.check_full_agents(agents, base)
        full.check_fits(agents, base, resolve_device(base.device), shards=shards)  # before anything is loaded
        self.specs = list(agents)
        self.base_config = base
        self.names = [f"agent{i}" for i in range(len(agents))]
        self.pool = Pool(base)
        self.models = self.pool.models  # the checkpoint's names: team.models.<key>.…
        self.agents: list[Agent] = []
        shared: dict[str, Base] = {}  # base name -> the base its LoRA agents share
        for i, (name, spec) in enumerate(zip(self.names, self.specs)):
            base_name = spec.base or base.name
            if spec.finetune == "full":  # a copy of its own
                own = self.pool.add(load_base(f"full{i}", base_name, base, full_copy=True))
                self.agents.append(Agent(name, own, own))
                continue
            new = base_name not in shared  # the first agent on it: its base to load
            if new:
                shared[base_name] = load_base(f"base{len(shared)}", base_name, base)
            on = shared[base_name]
            self.agents.append(Agent(name, on, on))
            option, where = f"model.agents[{i}].lora.target_modules", f"{base_name} ({on.architecture})"
            lora = lora_config(on.layers, spec.lora, option, where)
            try:
                if new:
                    on.model = get_peft_model(on.model, lora, adapter_name=name)
                    self.pool.add(on)
                else:
                    on.model.add_adapter(name, lora)
            except ValueError as e:  # a name peft cannot adapt (a norm, a whole block)
                raise UserError(
                    f"{option}: {str(e).splitlines()[0]}; the linear layers of {where}: "
                    f"{' '.join(on.layers.names(on.layers.linear + on.layers.head))}"
                ) from None
        for agent in self.agents:  # a full agent's reference: the LoRA agents' base on its base name, when any
            if agent.base.full:
                agent.reference = self.pool.lora_base(agent.base.name) or agent.base
        for model in self.models.values():
            train_adapters_only(model)
            if base.gradient_checkpointing and is_peft(model):
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
        the bytes a token takes on its base: :meth:`Base.cache_bytes_per_token`); the requests of a :meth:`generate`
        call that need more are decoded in consecutive parts, each at most this size (a request's n samples
        stay together). ``None``: one batch per base. Set from ``--model.decode_memory_gb``."""
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

    def targets_report(self) -> str:
        """What LoRA adapts on each base, one line per base (:func:`~collab.policy.targets.targets_report`), and what
        each full agent holds (:func:`~collab.policy.full.memory_line`); printed once at the start of a run."""
        return "\n".join(line for line in (targets_report(self), full.memory_line(self)) if line)

    def untrained(self, agent: int) -> nn.Module:
        """``agent``'s base before any training: the reference policy, and what frozen-base critics read."""
        return self.pool.untrained(self.agents[agent].reference, self.device)

    def model_of(self, agent: int):
        return self.agents[agent].base.model

    def tokenizer_of(self, agent: int):
        return self.agents[agent].base.tokenizer

    def freeze(self, agents: list[int]) -> None:
        """Keep the adapters (full agents: the models) of ``agents`` as they are: no gradient, whatever adapter
        switches later do (peft's ``set_adapter`` makes the active adapter trainable; :func:`train_adapters_only`)."""
        for agent in agents:
            model = self.model_of(agent)
            model.collab_frozen = {*getattr(model, "collab_frozen", ()), self.names[agent]}
        for model in self.models.values():
            train_adapters_only(model)

    def is_frozen(self, agent: int) -> bool:
        """Whether :meth:`freeze` froze ``agent``'s adapter."""
        return self.names[agent] in getattr(self.model_of(agent), "collab_frozen", ())

    def adapter_parameters(self, agent: int) -> list[nn.Parameter]:
        """The trainable parameters of one agent: its LoRA adapter's, or every parameter of a full agent's model."""
        return self.agents[agent].parameters()

    def _choice_ids(self, agent: int) -> Tensor | None:
        choices = self.specs[agent].choices
        if not choices:
            return None
        tokenizer = self.tokenizer_of(agent)
        ids = []
        for choice in choices:
            tokens = tokenizer.encode(choice, add_special_tokens=False)
            if len(tokens) != 1:
                raise UserError(
                    f"action choice {choice!r} is {len(tokens)} tokens for this tokenizer; "
                    "choices must be single tokens"
                )
            ids.append(tokens[0])
        return torch.tensor(ids)

    # -- prompts -----------------------------------------------------------------------------------
    def encode(self, agent: int, messages) -> list[int]:
        """Token ids of an agent's chat history, ending with the assistant turn's header."""
        return encode_chat(self.tokenizer_of(agent), messages)

    # -- acting ------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(
        self, requests: list[GenerationRequest], max_new_tokens: int = 128, stop: str | None = None
    ) -> list[list[Completion]]:
        """Sample ``request.n`` responses for every request; one decoding loop per distinct base. ``stop``: a text
        that ends a response too (:func:`~collab.policy.sampling.decode`).

        All agents and all samples on a base share one batch (rows carry their adapter names; parts of at
        most :attr:`decode_memory` of KV cache when they need more: :meth:`decode_parts`), and
        the prompt of each request is prefilled once and its KV cache repeated for its n samples.
        With an :attr:`engine`, vLLM samples and the behaviour log-probs are this model's.
        """
        if self.engine is not None:
            return self.engine.generate(self, requests, max_new_tokens, stop)
        results: list[list[Completion] | None] = [None] * len(requests)
        for base in self.pool.bases:
            mine = [i for i, r in enumerate(requests) if self.agents[r.agent].base is base]
            if not mine:
                continue
            rows = [requests[i] for i in mine]
            settings = []
            for r in rows:
                s = self.specs[r.agent].sampling
                settings.append(
                    (
                        s.temperature,
                        s.top_p,
                        s.top_k,
                        r.max_new_tokens or s.max_new_tokens or max_new_tokens,
                        self.choice_ids[r.agent],
                    )
                )
            with eval_mode(base.model):
                for part in self.decode_parts(base, rows, settings):
                    outs = decode(
                        base.model,
                        base.tokenizer,
                        [rows[j] for j in part],
                        [self.names[rows[j].agent] for j in part],
                        [settings[j] for j in part],
                        stop,
                    )
                    for j, out in zip(part, outs):
                        results[mine[j]] = out
        return results  # type: ignore[return-value]

    def decode_parts(self, base: Base, rows: list[GenerationRequest], settings) -> list[list[int]]:
        """The requests ``rows`` on ``base`` (positions in ``rows``) in parts whose KV cache fits
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
        from collab.runtime.memory import token_budget_chunks

        lengths = [len(r.prompt_ids) + (1 if s[4] is not None else s[3]) for r, s in zip(rows, settings)]
        budget = max(1, int(self.decode_memory // base.cache_bytes_per_token()))
        need = sum(r.n for r in rows) * max(lengths, default=0)  # the padded tokens of one batch
        if need <= budget:
            return [list(range(len(rows)))] if rows else []
        order = sorted(range(len(rows)), key=lambda j: (rows[j].agent, rows[j].prompt_ids))
        parts = [
            [order[j] for j in part]
            for part in token_budget_chunks([lengths[j] for j in order], budget, [rows[j].n for j in order])
        ]
        if len(parts) > 1:
            if self.decode_parts_seen == 0:
                import sys

                print(
                    f"decoding in parts: {sum(r.n for r in rows)} samples x {max(lengths)} tokens of KV cache "
                    f"({need * base.cache_bytes_per_token() / 2**30:.2f} GiB) is over --model.decode_memory_gb "
                    f"({self.decode_memory / 2**30:.2f} GiB): {len(parts)} parts",
                    file=sys.stderr,
                    flush=True,
                )
            self.decode_parts_seen += 1
        return parts

    # -- learning ----------------------------------------------------------------------------------
    def logprobs(
        self,
        agent: int | list[int],
        prompt_ids: list[list[int]],
        completion_ids: list[list[int]],
        reference: bool = False,
        entropy: bool = False,
        own: list[list[bool] | None] | None = None,
    ):
        """Teacher-forced per-token log-probs of each completion given its prompt (with gradients).

        ``agent`` is one agent for all rows or one per row (rows of agents on different bases are
        split by base). The sequence log-prob of CoLLM, Section 4.2 is ``out[b].sum()``.
        ``reference=True`` uses the untrained base (the reference policy: :meth:`untrained`). With
        ``entropy=True`` the result is ``(logprobs, entropies)``: also the per-token entropy of the
        agent's policy (the PPO entropy bonus), from the same forward. ``own[i]`` marks the tokens of completion
        ``i`` that its agent wrote (None: all of them): only those are scored (:mod:`collab.policy.scoring`).
        """
        agents = [agent] * len(prompt_ids) if isinstance(agent, int) else list(agent)
        out: list[Tensor | None] = [None] * len(agents)
        ent: list[Tensor | None] = [None] * len(agents)
        bases = [self.agents[a].reference if reference else self.agents[a].base for a in agents]
        for base in self.pool.bases:
            idx = [i for i, b in enumerate(bases) if b is base]
            if idx:
                res = logprobs_on_base(
                    self,
                    base,
                    [agents[i] for i in idx],
                    [prompt_ids[i] for i in idx],
                    [completion_ids[i] for i in idx],
                    reference,
                    entropy,
                    None if own is None else [own[i] for i in idx],
                )
                for i, (r, e) in zip(idx, res):
                    out[i], ent[i] = r, e
        return (out, ent) if entropy else out

    # -- persistence -------------------------------------------------------------------------------
    def save_adapters(self, folder: str | Path, write: bool = True) -> None:
        """Write each agent's adapter as a peft folder ``folder/agentI`` (config + safetensors); a full agent's
        model as a transformers model folder (:func:`~collab.policy.full.save_full`). Sharded weights (FSDP2) are
        gathered first, a collective: every process calls it, the one with ``write`` writes."""
        for i, name in enumerate(self.names):
            self.save_adapter(i, Path(folder) / name, write)

    def save_adapter(self, agent: int, out: str | Path, write: bool = True) -> None:
        """Write one agent's adapter as a peft folder (what peft, vLLM and :meth:`load_adapters` read). Its
        ``base_model_name_or_path`` is where the base loads from (:func:`~collab.policy.models.model_folder`: a
        hub id or an absolute folder), so that ``AutoPeftModelForCausalLM.from_pretrained(out)`` finds it; the
        random ``tiny`` base has none (null). Sharded weights are gathered whole on every process (a collective);
        only with ``write`` is anything written."""
        import copy

        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        out = Path(out)
        name, base = self.names[agent], self.agents[agent].base
        model = base.model
        if base.full:  # its own state dict when whole (save_pretrained finds the tied head)
            state = whole_state(model.state_dict(keep_vars=True)) if lockstep.active() is not None else None
        else:
            state = get_peft_model_state_dict(model, adapter_name=name)
            state = {k: whole(v).detach().contiguous().cpu() for k, v in state.items()}
        if not write:
            return
        out.mkdir(parents=True, exist_ok=True)
        (out / "agent.json").write_text(json.dumps(asdict(self.specs[agent]), indent=2))
        if base.full:
            return full.save_full(model, base.tokenizer, out, state)
        save_file(state, out / "adapter_model.safetensors")
        config = copy.copy(model.peft_config[name])
        config.base_model_name_or_path = base_location(base.name)
        config.save_pretrained(out)

    def load_adapters(self, folder: str | Path) -> None:
        """Load adapters written by :meth:`save_adapters` (or peft) into the team's agents, and full agents' models."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        folder = Path(folder)
        paths = [
            folder / agent.name / ("config.json" if agent.base.full else "adapter_model.safetensors")
            for agent in self.agents
        ]
        for agent, path in zip(self.agents, paths):  # all or nothing
            if not path.is_file():
                kind = "model (finetune: full)" if agent.base.full else "adapter"
                raise UserError(f"no {kind} for {agent.name} in {folder} (expected {path})")
        for agent, path in zip(self.agents, paths):
            if agent.base.full:
                full.load_full_state(agent.base.model, path.parent, agent.name)
            else:
                set_peft_model_state_dict(agent.base.model, load_file(path), adapter_name=agent.name)


def base_location(name: str) -> str | None:
    """What ``from_pretrained`` loads base ``name`` from: a hub id, or a local folder as an absolute path (None for
    the random ``tiny`` model, which no folder holds)."""
    if name == TINY:
        return None
    folder = model_folder(name)
    return str(Path(folder).resolve()) if Path(folder).exists() else folder
