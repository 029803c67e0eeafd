"""Training memory: a 2-agent + centralized-critic team in collab vs. full models with full-parameter AdamW.

collab
    one ``AgentTeam`` of ``--agents`` ``AgentSpec``s over one shared base (each agent a LoRA adapter,
    r=8 on every linear layer) and ``Critics(team, env, "centralized", packaged_spec(context=None))`` (one more
    LoRA adapter on the same base plus a linear value head); one ``torch.optim.AdamW`` over
    ``team.adapter_parameters(i)`` of every agent and ``critics.parameters_of(0)``. The base weights
    are frozen and held once.
reference design
    ``--agents`` + 1 separate full copies of the base (``collab.policy.models.load_model``): the actors are
    plain ``AutoModelForCausalLM``s, the critic is the same model read at its last hidden state (after
    the final norm) by a linear value head. Every parameter is trainable and one AdamW holds them all.

One training step each (``--steps`` to run more), on the same batch: ``--batch`` prompt/response pairs
per agent (random token ids, ``--prompt-tokens`` + ``--response-tokens`` long, seeded) and ``--batch``
centralized critic states (the joint history of those pairs, as ``collab.algos.llm_critics.centralized_input``
renders it, with the paper's global information), with the same loss on both sides::

    loss = -mean_{i,k}[(R_k - V_k).detach() * mean_t log pi_i(y_{i,k,t} | ...)] + mean_k (V_k - R_k)^2

collab computes the log-probs with ``team.logprobs`` (one mixed-adapter forward over all agents' rows)
and the values with ``critics.state_values``; the reference with a plain forward of each actor
(``logits_to_keep`` = response length + 1, as collab does) + ``log_softmax``/``gather``, and the
critic's backbone. Then ``backward()`` and ``optimizer.step()``. float32 throughout.

What is measured. Each method runs in a fresh subprocess (the script re-invokes itself with
``--method collab|reference``), so neither sees the other's allocations; both children run with a
fixed glibc mmap threshold (``MALLOC_MMAP_THRESHOLD_=65536``) so that freed tensors leave the RSS
(glibc's dynamic threshold otherwise keeps up to 32 MiB blocks in the heap after they are freed,
which added ~1.4 GB of dead memory to collab's checkpointed step); ``--glibc-default`` turns it off:

- peak RSS: the child's ``ru_maxrss`` at its end (CPU). It is the whole process: the interpreter,
  torch, transformers and peft (both children import the same modules), the model load, the step.
  Nothing is subtracted; the ``import`` column is the RSS after those imports, before any model is
  built, so the reader can subtract it. With ``--device cuda`` the peak is
  ``torch.cuda.max_memory_allocated`` instead (the RSS is still shown).
- tensor bytes: sum of ``numel * element_size`` of the distinct parameter tensors (tied weights once),
  of their ``.grad``s, and of the AdamW states after the step: the steady memory of training, free of
  allocator and activation noise.
- activations: the bytes autograd saved for the backward pass during the (last) step's forward
  (distinct storages other than parameters, recorded with ``saved_tensors_hooks``), also noise-free.

Reading the figures. Both designs push the same tokens through networks of the same shape, so their
activations are about equal, and in float32 they are large next to a 135M model: the centralized
critic reads both agents' dialogs (~530 tokens a state at the default sizes). The peak RSS is therefore
roughly import + parameters touched + activations for collab, and for the reference the larger of that
and import + params + grads + AdamW states. With a single step from a fresh optimizer (the default)
the reference allocates its AdamW states only in ``optimizer.step()``, after the backward has freed the
activations, so they do not add up; from the second step on (``--steps 2``) the states live through
the forward, and the reference's peak is about import + params + AdamW states + activations.
The peak RSS of identical work varies between runs (by up to ~2.5 GiB in runs on a shared 2-core
machine: the allocator's fragmentation); the tensor and activation columns do not.

    # SmolLM2-135M, batch 2: ~3 min on 2 CPU cores
    cd /work/main && PYTHONPATH=src .venv/bin/python benchmarks/memory.py
    PYTHONPATH=src .venv/bin/python benchmarks/memory.py --batch 4      # 4 pairs per agent: ~4-5 min
    PYTHONPATH=src .venv/bin/python benchmarks/memory.py --steps 2      # steady state: AdamW states live in the forward
    PYTHONPATH=src .venv/bin/python benchmarks/memory.py --model tiny   # quick check (~30 s)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

MARK = "MEMORY-RESULT "
MIB = 2**20


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="base model name (default: %(default)s)")
    ap.add_argument("--agents", type=int, default=2, help="number of agents (default: %(default)s)")
    ap.add_argument("--batch", type=int, default=2, help="prompt/response pairs per agent (default: %(default)s)")
    ap.add_argument("--prompt-tokens", type=int, default=128, help="(default: %(default)s)")
    ap.add_argument("--response-tokens", type=int, default=64, help="(default: %(default)s)")
    ap.add_argument(
        "--steps",
        type=int,
        default=1,
        help="training steps on the batch; figures are of the last, the peak of them all (default: %(default)s)",
    )
    ap.add_argument("--lr", type=float, default=1e-5, help="AdamW learning rate (default: %(default)s)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (default: %(default)s)")
    ap.add_argument(
        "--glibc-default",
        action="store_true",
        help="keep glibc's dynamic mmap threshold in the children (freed memory may stay in the RSS)",
    )
    ap.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="recompute activations in backward, on both sides (BaseConfig.gradient_checkpointing)",
    )
    ap.add_argument("--seed", type=int, default=0, help="(default: %(default)s)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads; 0 keeps torch's default")
    ap.add_argument(
        "--method",
        choices=["both", "collab", "reference"],
        default="both",
        help="both: run each method in its own subprocess and compare (default); "
        "collab|reference: run one method in this process and print its figures",
    )
    return ap.parse_args(argv)


# -- shared inputs -------------------------------------------------------------------------------------
def current_rss_kib() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def peak_rss_kib() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak // 1024 if sys.platform == "darwin" else peak  # bytes on macOS, KiB on Linux


def make_batch(args, tokenizer, env):
    """Per agent: prompts and responses (token ids); per joint sample k: the critic's state and reward."""
    import torch

    from collab.envs.base import EnvState

    gen = torch.Generator().manual_seed(args.seed)
    low, high = 256, len(tokenizer)  # past the special and byte tokens

    def ids(n: int) -> list[int]:
        return torch.randint(low, high, (n,), generator=gen).tolist()

    prompts = [[ids(args.prompt_tokens) for _ in range(args.batch)] for _ in range(args.agents)]
    responses = [[ids(args.response_tokens) for _ in range(args.batch)] for _ in range(args.agents)]
    states = []
    for k in range(args.batch):
        histories = tuple(
            (
                {"role": "user", "content": tokenizer.decode(prompts[i][k])},
                {"role": "assistant", "content": tokenizer.decode(responses[i][k])},
            )
            for i in range(args.agents)
        )
        states.append(EnvState(task={}, histories=histories, turn=1, memory={"last_reward": 0.5}))
    rewards = torch.rand(args.batch, generator=gen) * float(env.reward_max or 1.0)
    return prompts, responses, states, rewards


def loss_fn(seq_logprobs, values, rewards):
    """seq_logprobs ``[agents, batch]`` (mean per-token log-prob), values and rewards ``[batch]``."""
    advantage = (rewards - values).detach()
    return -(advantage[None, :] * seq_logprobs).mean() + ((values - rewards) ** 2).mean()


def tensor_bytes(params, optimizer) -> dict[str, int]:
    seen, p_bytes, g_bytes = set(), 0, 0
    for p in params:
        if id(p) in seen:
            continue
        seen.add(id(p))
        p_bytes += p.numel() * p.element_size()
        if p.grad is not None:
            g_bytes += p.grad.numel() * p.grad.element_size()
    o_bytes = sum(
        v.numel() * v.element_size()
        for state in optimizer.state.values()
        for v in state.values()
        if hasattr(v, "numel")
    )
    trainable = sum(p.numel() for group in optimizer.param_groups for p in group["params"])
    return {"params": p_bytes, "grads": g_bytes, "optim": o_bytes, "trainable": trainable, "n_params": len(seen)}


class SavedBytes:
    """Counts the distinct non-parameter storages autograd saves for backward (pack hook)."""

    def __init__(self, params) -> None:
        self.skip = {p.untyped_storage().data_ptr() for p in params}
        self.seen: set[int] = set()
        self.total = 0

    def pack(self, t):
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # not a plain dense tensor
            return t
        ptr = storage.data_ptr()
        if ptr not in self.skip and ptr not in self.seen:
            self.seen.add(ptr)
            self.total += storage.nbytes()
        return t

    @staticmethod
    def unpack(t):
        return t


# -- the two methods ---------------------------------------------------------------------------------------
def build_collab(args, env):
    import torch

    from collab.algos.llm_critics import Critics, packaged_spec
    from collab.policy.models import BaseConfig
    from collab.policy.team import AgentSpec, AgentTeam

    specs = [AgentSpec(role=env.roles[i % len(env.roles)].name) for i in range(args.agents)]
    team = AgentTeam(
        specs, BaseConfig(name=args.model, device=args.device, gradient_checkpointing=args.gradient_checkpointing)
    )
    critics = Critics(team, env, "centralized", packaged_spec(context=None))  # the whole input, as the full models
    critics.to(team.device)
    team.train()  # as Lightning's fit does (checkpointing applies in train mode only)
    critics.train()
    trainable = [p for i in range(len(team)) for p in team.adapter_parameters(i)] + critics.parameters_of(0)
    optimizer = torch.optim.AdamW(trainable, lr=args.lr)
    everything = list(team.parameters()) + list(critics.parameters())

    def step(prompts, responses, states, rewards):
        optimizer.zero_grad(set_to_none=True)
        agents = [i for i in range(args.agents) for _ in range(args.batch)]
        flat_p = [p for per_agent in prompts for p in per_agent]
        flat_r = [r for per_agent in responses for r in per_agent]
        lps = team.logprobs(agents, flat_p, flat_r)
        seq = torch.stack([lp.mean() for lp in lps]).view(args.agents, args.batch)
        values = critics.state_values(states)[:, 0]
        loss = loss_fn(seq, values, rewards.to(values.device))
        loss.backward()
        optimizer.step()
        return loss.item()

    return team.tokenizer_of(0), step, everything, optimizer


def build_reference(args, env):
    import torch
    from torch import nn

    from collab.algos.llm_critics import centralized_input
    from collab.policy.models import BaseConfig, encode_chat, load_model, load_tokenizer
    from collab.policy.prefixes import pad_left

    config = BaseConfig(name=args.model, device=args.device, gradient_checkpointing=args.gradient_checkpointing)
    tokenizer = load_tokenizer(args.model)
    actors = [load_model(config) for _ in range(args.agents)]
    critic = load_model(config)
    device = critic.get_input_embeddings().weight.device
    head = nn.Linear(critic.config.hidden_size, 1).to(device)
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)
    everything = [p for m in [*actors, critic, head] for p in m.parameters()]
    for m in [*actors, critic]:
        m.train()
    for p in everything:
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(everything, lr=args.lr)
    roles = [env.roles[i % len(env.roles)].name for i in range(args.agents)]

    def inputs(seqs):
        input_ids, mask, positions = pad_left(seqs, tokenizer.pad_token_id, device)
        return dict(input_ids=input_ids, attention_mask=mask, position_ids=positions)

    def step(prompts, responses, states, rewards):
        optimizer.zero_grad(set_to_none=True)
        seq = []
        for i, actor in enumerate(actors):
            rows = [list(p) + list(r) for p, r in zip(prompts[i], responses[i])]
            keep = max(len(r) for r in responses[i]) + 1
            logits = actor(**inputs(rows), logits_to_keep=keep).logits
            per_agent = []
            for b, r in enumerate(responses[i]):
                lp = logits[b, -len(r) - 1 : -1].float().log_softmax(-1)
                per_agent.append(lp.gather(-1, torch.as_tensor(r, device=device)[:, None]).squeeze(-1).mean())
            seq.append(torch.stack(per_agent))
        chats = [centralized_input(s, roles, env.horizon, env.reward_max) for s in states]
        hidden = critic.model(**inputs([encode_chat(tokenizer, c) for c in chats])).last_hidden_state[:, -1]
        values = head(hidden).squeeze(-1).float()
        loss = loss_fn(torch.stack(seq), values, rewards.to(device))
        loss.backward()
        optimizer.step()
        return loss.item()

    return tokenizer, step, everything, optimizer


def measure(args) -> dict:
    """Build ``args.method``'s models, run one training step, return its figures (in this process)."""
    import peft  # noqa: F401
    import torch
    import transformers  # noqa: F401

    import collab.algos.llm_critics  # noqa: F401  -- the same imports on both sides before the baseline
    import collab.policy.team  # noqa: F401
    from collab.envs import make_env

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    cuda = args.device.startswith("cuda")
    env = make_env("writing")
    rss_import = current_rss_kib()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(args.seed)
    start = time.perf_counter()
    build = build_collab if args.method == "collab" else build_reference
    tokenizer, step, everything, optimizer = build(args, env)
    build_s = time.perf_counter() - start
    prompts, responses, states, rewards = make_batch(args, tokenizer, env)
    rss_built = current_rss_kib()
    for _ in range(args.steps):
        saved = SavedBytes(everything)
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
            loss = step(prompts, responses, states, rewards)
        if cuda:
            torch.cuda.synchronize()
        step_s = time.perf_counter() - start
    out = {
        "method": args.method,
        "device": args.device,
        "threads": torch.get_num_threads(),
        "rss_import_kib": rss_import,
        "rss_built_kib": rss_built,
        "rss_peak_kib": peak_rss_kib(),
        "build_s": build_s,
        "step_s": step_s,
        "loss": loss,
        "activations": saved.total,
        **tensor_bytes(everything, optimizer),
    }
    if cuda:
        out["cuda_peak"] = torch.cuda.max_memory_allocated()
    return out


# -- driver -----------------------------------------------------------------------------------------
# glibc raises its mmap threshold as large blocks are freed (up to 32 MiB), after which freed tensors
# stay in the heap and keep counting in the RSS; a fixed threshold returns them to the OS, so the peak
# RSS reflects what is live. Applied to both children alike (--glibc-default turns it off).
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def run_child(method: str, argv: list[str], glibc_default: bool = False) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), *argv, "--method", method]
    env = {**os.environ, **({} if glibc_default else MALLOC_ENV)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"{method} run failed (exit {proc.returncode})")
    return json.loads(lines[-1][len(MARK) :])


def report(args, res: dict[str, dict]) -> None:
    c, r = res["collab"], res["reference"]
    cuda = "cuda_peak" in c
    print(
        f"model={args.model} device={args.device} threads={c['threads']} agents={args.agents} + 1 centralized critic, "
        f"batch={args.batch}/agent, prompt={args.prompt_tokens} + response={args.response_tokens} tokens, "
        f"steps={args.steps}, float32"
    )
    peak_name = "cuda peak" if cuda else "peak RSS"
    print(
        f"\n{'method':<10} {peak_name:>9} {'import':>7} {'built':>7} {'params':>8} {'grads':>8} {'AdamW':>8} "
        f"{'tensors':>8} {'activ.':>8} {'trainable':>12} {'build s':>8} {'step s':>7}"
    )
    for name, x in (("collab", c), ("reference", r)):
        mib = lambda b: (b or 0) / MIB  # noqa: E731
        tensors = x["params"] + x["grads"] + x["optim"]
        peak = mib(x["cuda_peak"]) if cuda else x["rss_peak_kib"] / 1024
        print(
            f"{name:<10} {peak:>9.0f} {(x['rss_import_kib'] or 0) / 1024:>7.0f} "
            f"{(x['rss_built_kib'] or 0) / 1024:>7.0f} "
            f"{mib(x['params']):>8.1f} {mib(x['grads']):>8.1f} {mib(x['optim']):>8.1f} {mib(tensors):>8.1f} "
            f"{mib(x['activations']):>8.1f} {x['trainable']:>12,} {x['build_s']:>8.1f} {x['step_s']:>7.1f}"
        )
    print(
        "MiB. peak RSS: the whole process (ru_maxrss), nothing subtracted; import / built: RSS after the imports "
        "(interpreter, torch, transformers, peft, collab) / after building the models (weights are read lazily, "
        "so they count once touched); tensors = params + grads + AdamW states; activ. = saved for backward; "
        "step s = wall time of the (last) step: forward, backward, AdamW."
    )
    top = {k: (x["cuda_peak"] if cuda else x["rss_peak_kib"]) for k, x in res.items()}
    tot = {k: x["params"] + x["grads"] + x["optim"] for k, x in res.items()}
    print(
        f"\nratio collab / reference: {peak_name} {top['collab'] / top['reference']:.3f}   "
        f"tensors {tot['collab'] / tot['reference']:.3f}   step time {c['step_s'] / r['step_s']:.2f}"
    )
    if not cuda and c["rss_import_kib"] and r["rss_import_kib"]:
        above = (c["rss_peak_kib"] - c["rss_import_kib"]) / (r["rss_peak_kib"] - r["rss_import_kib"])
        print(f"(peak RSS above the import RSS: {above:.3f})")


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.method != "both":
        print(MARK + json.dumps(measure(args)), flush=True)
        return
    res = {m: run_child(m, argv, args.glibc_default) for m in ("collab", "reference")}
    report(args, res)


if __name__ == "__main__":
    main()
