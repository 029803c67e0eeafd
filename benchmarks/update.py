"""The update's teacher-forced forward and backward, with the K samples' shared prompt computed once or not.

A MAGRPO update on the writing default: 2 posts x 2 agents x K = 4 samples, completions of 48 (concise)
and 96 (detailed) tokens after prompts of about 190. ``AgentTeam.logprobs`` runs each agent's prompt
once and repeats its KV cache for the K rows (``collab.policy.prefixes.shared_prefix_forward``);
"one pass" runs every row's whole prompt (``MIN_PREFIX_SAVING`` above 1 turns sharing off). Each
repeat times one forward + backward of the summed log-probs (the update) and one no-grad forward
with the adapters off (the reference policy, for the KL); the order alternates across repeats.

    PYTHONPATH=src .venv/bin/python benchmarks/update.py                      # SmolLM2: ~3 min on 2 cores
    PYTHONPATH=src .venv/bin/python benchmarks/update.py --model tiny --repeats 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import collab.policy.prefixes as prefixes
from collab.envs.writing import WritingEnv
from collab.policy.models import BaseConfig
from collab.policy.team import AgentSpec, AgentTeam


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="base model name (default: %(default)s)")
    ap.add_argument("--posts", type=int, default=2, help="(default: %(default)s)")
    ap.add_argument("--k", type=int, default=4, help="samples per agent and post (default: %(default)s)")
    ap.add_argument("--tokens", type=int, nargs=2, default=[48, 96], help="completion lengths of the two agents")
    ap.add_argument("--repeats", type=int, default=3, help="(default: %(default)s)")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    env = WritingEnv()
    team = AgentTeam([AgentSpec() for _ in env.roles], BaseConfig(name=args.model))
    vocab = team.tokenizer_of(0).vocab_size
    agents, prompts, completions = [], [], []
    for task in env.tasks("train")[: args.posts]:
        for a, text in enumerate(env.observe(task)):
            ids = team.encode(a, [{"role": "user", "content": text}])
            for _ in range(args.k):
                agents.append(a)
                prompts.append(ids)
                completions.append(torch.randint(5, vocab, (args.tokens[a],)).tolist())
    print(
        f"model={args.model} threads={torch.get_num_threads()} rows={len(agents)} "
        f"prompt tokens {sum(map(len, prompts))} (longest {max(map(len, prompts))}), "
        f"completion tokens {sum(map(len, completions))}"
    )
    threshold = prefixes.MIN_PREFIX_SAVING
    methods = {"shared": threshold, "one pass": 2.0}

    def run(method: str) -> tuple[float, float]:
        prefixes.MIN_PREFIX_SAVING = methods[method]
        try:
            team.zero_grad(set_to_none=True)
            start = time.perf_counter()
            out = team.logprobs(agents, prompts, completions)
            torch.stack([t.sum() for t in out]).sum().backward()
            update = time.perf_counter() - start
            start = time.perf_counter()
            with torch.no_grad():
                team.logprobs(agents, prompts, completions, reference=True)
            return update, time.perf_counter() - start
        finally:
            prefixes.MIN_PREFIX_SAVING = threshold

    for m in methods:
        run(m)
    seconds: dict[str, list[tuple[float, float]]] = {m: [] for m in methods}
    print(f"\n{'repeat':>6}  {'first':<9} {'shared fwd+bwd':>14} {'ref':>6}  {'one-pass fwd+bwd':>16} {'ref':>6}")
    for r in range(args.repeats):
        order = list(methods) if r % 2 == 0 else list(reversed(methods))
        for m in order:
            seconds[m].append(run(m))
        s, o = seconds["shared"][-1], seconds["one pass"][-1]
        print(f"{r:>6}  {order[0]:<9} {s[0]:>14.2f} {s[1]:>6.2f}  {o[0]:>16.2f} {o[1]:>6.2f}")
    med = {m: [statistics.median(x[i] for x in v) for i in (0, 1)] for m, v in seconds.items()}
    print(
        f"\nmedian seconds: shared {med['shared'][0]:.2f} + {med['shared'][1]:.2f} (reference), "
        f"one pass {med['one pass'][0]:.2f} + {med['one pass'][1]:.2f}"
    )
    print(
        f"speed-up of sharing: update {med['one pass'][0] / med['shared'][0]:.2f}x, "
        f"reference {med['one pass'][1] / med['shared'][1]:.2f}x"
    )


if __name__ == "__main__":
    main()
