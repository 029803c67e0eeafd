"""Rollout throughput of the engines: collab's batched loop, vLLM multi-LoRA and a per-agent loop of HF generate.

torch (collab's default engine)
    ``team.generate`` with one ``GenerationRequest(agent, prompt, n=K)`` per agent: every agent's K
    samples share one decoding loop (rows carry their adapter names), each prompt prefilled once.
vllm (``--model.engine vllm``)
    the same call with a :class:`~collab.policy.vllm_engine.VllmEngine`: one vLLM engine, one LoRA adapter
    per agent, then the behaviour log-probs recomputed by the training model (timed apart as "rescore").
tools (``--engine torch tools``)
    collab's loop with tool calls within the turn (:mod:`collab.tools.turns`): every agent has the calculator and
    its turn opens with a call to it (``tool_choice``), so each row decodes in two rounds at least, with the tool
    and a re-prefill between them. Counted: the agents' own tokens (the forced opening and the results are not).
    With ``tools`` among the engines every engine gets the same prompts: a calculation task with the tools'
    instructions in the system message, so the ratio against ``torch`` is what the pauses cost.
tools-again
    the same turns with every round's rows prefilled again from their whole context (their kept KV caches
    dropped): the ratio of ``tools`` to it is what keeping the caches saves.
hf (what the reference code does)
    for each agent in turn: ``peft_model.set_adapter(name)`` and HF
    ``model.generate(input_ids, attention_mask, do_sample=True, temperature, top_p,
    max_new_tokens, num_return_sequences=K)``.

All use the same team (same model object; adapters r 8 with random B, so that they change the model),
the same sampling settings and length limit. Generated tokens are counted up to and including the first
EOS. The order of the engines rotates across repeats; each is warmed up once before timing. Ratios are
against the torch engine, measured in the same run. vllm needs ``.venv-vllm`` (``bash scripts/setup.sh
--with-vllm``); without vllm the engine is left out.

    PYTHONPATH=src .venv-vllm/bin/python benchmarks/rollout.py                       # 2 agents x K=4 x 48 tokens
    PYTHONPATH=src .venv-vllm/bin/python benchmarks/rollout.py --agents 4 --k 16 --max-new-tokens 256 --repeats 1
    PYTHONPATH=src .venv/bin/python benchmarks/rollout.py --model tiny --repeats 5     # quick smoke run (no vllm)
    PYTHONPATH=src .venv/bin/python benchmarks/rollout.py --engine torch tools tools-again   # a rollout with tool calls
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

import torch

from collab.policy.models import BaseConfig
from collab.policy.sampling import GenerationRequest
from collab.policy.team import AgentSpec, AgentTeam, SamplingSpec

ROLES = [
    ("writer", "You are a creative writer. Write vivid, concrete prose with varied vocabulary."),
    ("editor", "You are a careful editor. Improve the draft's clarity, rhythm and word choice."),
    ("critic", "You are a literary critic. Point out what works and what does not, briefly."),
]
TOOL_TASK = "Compute 48213 * 907 + 5521 with the calculator, then say what the result means for a budget of 50 million."
TASK = (
    "Write a short story of about 150 words about a lighthouse keeper who finds a message in a bottle "
    "on the morning of a storm. Use sensory details and end with a surprising but earned twist."
)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="base model name (default: %(default)s)")
    ap.add_argument("--agents", type=int, default=2, help="number of agents (default: %(default)s)")
    ap.add_argument("--k", type=int, default=4, help="samples per agent (default: %(default)s)")
    ap.add_argument("--max-new-tokens", type=int, default=48, help="(default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats of each method (default: %(default)s)")
    ap.add_argument("--temperature", type=float, default=0.8, help="(default: %(default)s)")
    ap.add_argument("--top-p", type=float, default=0.95, help="(default: %(default)s)")
    ap.add_argument("--device", default="auto", help="auto, cpu, cuda... (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="(default: %(default)s)")
    ap.add_argument(
        "--engine",
        "--engines",
        dest="engines",
        nargs="+",
        default=["torch", "vllm", "hf"],
        choices=["torch", "vllm", "hf", "tools", "tools-again"],
        help="engines to compare (default: all; vllm only where it imports)",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch CPU threads; 0 keeps torch's default. On a CPU shared with other busy processes, "
        "1 avoids OpenMP oversubscription (which can slow both methods >10x)",
    )
    return ap.parse_args(argv)


def build(args):
    torch.manual_seed(args.seed)
    specs = []
    for i in range(args.agents):
        role, system = ROLES[i % len(ROLES)]
        specs.append(
            AgentSpec(
                role=role,
                system_prompt=system,
                sampling=SamplingSpec(temperature=args.temperature, top_p=args.top_p, top_k=0),
            )
        )
    team = AgentTeam(specs, BaseConfig(name=args.model, device=args.device))
    with torch.no_grad():  # adapters that do something (peft starts B at zero)
        for model in team.models.values():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0.0, 0.01)
    encode, task = team.encode, TASK
    if {"tools", "tools-again"} & set(args.engines):
        encode, task = tool_team(team, args.agents).encode, TOOL_TASK
    prompts = [
        encode(i, [{"role": "system", "content": s.system_prompt}, {"role": "user", "content": task}])
        for i, s in enumerate(specs)
    ]
    return team, prompts


def tool_team(team: AgentTeam, agents: int):
    from collab.tools import make_tool
    from collab.tools.team import ToolTeam

    tools = {i: {"calculator": make_tool("calculator")} for i in range(agents)}
    return ToolTeam(team, tools, choice={i: "calculator" for i in range(agents)})


def run_tools(team: AgentTeam, prompts, k: int, max_new_tokens: int) -> int:
    requests = [GenerationRequest(i, p, n=k) for i, p in enumerate(prompts)]
    outputs = tool_team(team, len(prompts)).generate(requests, max_new_tokens=max_new_tokens)
    return sum(c.own_tokens for group in outputs for c in group)


class PrefillAgain:
    """The team with each round's requests stripped of the KV cache their last round kept."""

    def __init__(self, team: AgentTeam) -> None:
        self.team = team

    def generate(self, requests, max_new_tokens: int = 128, stop: str | None = None):
        return self.team.generate([replace(r, past=None) for r in requests], max_new_tokens, stop)

    def __getattr__(self, name: str):
        return getattr(self.team, name)


def run_tools_again(team: AgentTeam, prompts, k: int, max_new_tokens: int) -> int:
    return run_tools(PrefillAgain(team), prompts, k, max_new_tokens)


def count_generated(row: list[int], eos: set[int]) -> int:
    """Tokens up to and including the first EOS (all of them when there is none)."""
    for i, t in enumerate(row):
        if t in eos:
            return i + 1
    return len(row)


def run_collab(team: AgentTeam, prompts, k: int, max_new_tokens: int) -> int:
    requests = [GenerationRequest(i, p, n=k) for i, p in enumerate(prompts)]
    outputs = team.generate(requests, max_new_tokens=max_new_tokens)
    eos = {team.tokenizer_of(0).eos_token_id}
    return sum(count_generated(c.completion_ids, eos) for group in outputs for c in group)


RESCORE: list[float] = []
"""Seconds of each vllm call spent recomputing the behaviour log-probs with the training model."""


def run_vllm(engine):
    import collab.policy.vllm_engine as vllm_engine

    def run(team: AgentTeam, prompts, k: int, max_new_tokens: int) -> int:
        rescore = vllm_engine.rescore

        def timed_rescore(*a):
            start = time.perf_counter()
            rescore(*a)
            RESCORE.append(time.perf_counter() - start)

        team.engine, vllm_engine.rescore = engine, timed_rescore
        try:
            return run_collab(team, prompts, k, max_new_tokens)
        finally:
            team.engine, vllm_engine.rescore = None, rescore

    return run


@torch.no_grad()
def run_loop(team: AgentTeam, prompts, k: int, max_new_tokens: int) -> int:
    total = 0
    for i, p in enumerate(prompts):
        model, tokenizer = team.model_of(i), team.tokenizer_of(i)
        sampling = team.specs[i].sampling
        model.set_adapter(team.names[i])
        input_ids = torch.tensor([p], device=team.device)
        attention_mask = torch.ones_like(input_ids)
        out = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            do_sample=True,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            max_new_tokens=max_new_tokens,
            num_return_sequences=k,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        eos = {tokenizer.eos_token_id}
        total += sum(count_generated(row, eos) for row in out[:, input_ids.shape[1] :].tolist())
    return total


def timed(fn, *args) -> tuple[int, float]:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    tokens = fn(*args)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return tokens, time.perf_counter() - start


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    team, prompts = build(args)
    print(
        f"model={args.model} device={team.device} threads={torch.get_num_threads()} agents={args.agents} "
        f"K={args.k} max_new_tokens={args.max_new_tokens} temperature={args.temperature} top_p={args.top_p} "
        f"top_k=0 prompt_tokens={[len(p) for p in prompts]}"
    )

    methods = {"torch": run_collab, "hf": run_loop, "tools": run_tools, "tools-again": run_tools_again}
    if "vllm" in args.engines:
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            print("vllm does not import here: left out (bash scripts/setup.sh --with-vllm; run with .venv-vllm)")
        else:
            from collab.policy.vllm_engine import VllmEngine, VllmOptions

            start = time.perf_counter()
            engine = VllmEngine(
                team, VllmOptions(max_model_len=max(len(p) for p in prompts) + args.max_new_tokens + 16)
            )
            print(f"vllm engine start: {time.perf_counter() - start:.1f} s (once per run)")
            methods = {"torch": run_collab, "vllm": run_vllm(engine), "hf": run_loop, "tools": run_tools}
            methods["tools-again"] = run_tools_again
    methods = {m: fn for m, fn in methods.items() if m in args.engines}
    for fn in methods.values():  # warm-up: first-call allocations, lazy imports, the adapters' export
        torch.manual_seed(args.seed)
        fn(team, prompts, 1, 4)
    RESCORE.clear()

    rates: dict[str, list[float]] = {m: [] for m in methods}
    names = list(methods)
    print("\n" + f"{'repeat':>6}  {'first':<6}  " + "  ".join(f"{m + ' tok':>10} {'s':>7} {'tok/s':>7}" for m in names))
    for r in range(args.repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        row = {}
        for m in order:
            torch.manual_seed(args.seed + 1 + r)
            tokens, seconds = timed(methods[m], team, prompts, args.k, args.max_new_tokens)
            row[m] = (tokens, seconds)
            rates[m].append(tokens / seconds)
        print(
            f"{r:>6}  {order[0]:<6}  "
            + "  ".join(f"{row[m][0]:>10} {row[m][1]:>7.2f} {row[m][0] / row[m][1]:>7.1f}" for m in names)
        )

    med = {m: statistics.median(v) for m, v in rates.items()}
    print("\nmedian tokens/s: " + "   ".join(f"{m} {v:.1f}" for m, v in med.items()))
    if RESCORE:
        print(f"vllm: of which recomputing the behaviour log-probs, median {statistics.median(RESCORE):.2f} s per call")
    if "torch" in med:
        print("ratio to torch: " + "   ".join(f"{m} {v / med['torch']:.2f}x" for m, v in med.items() if m != "torch"))


if __name__ == "__main__":
    main()
