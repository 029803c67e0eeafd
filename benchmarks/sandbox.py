"""Sandbox throughput: programs per second through ``collab.sandbox.Pool`` vs. one unlimited subprocess at a time.

collab
    ``Pool(workers=os.cpu_count()).map(programs)``: every program in its own sandboxed interpreter
    (limits, clean environment, private dir, and as root: dedicated uid, network, IPC and mount namespaces
    with a minimal root file system, and a per-run memory cgroup where one can be made).
sequential baseline
    ``subprocess.run([sys.executable, "-c", program])`` one after the other, without any limits.
sequential, sandbox interpreter (for reference)
    the same, but with the interpreter and flags the sandbox uses (``<python> -I -S -B -c``), which
    separates the cost of the protections from that of interpreter start-up.

Workloads: ``toy`` (default), small HumanEval-like solutions followed by their asserts, half of them
failing an assert; ``humaneval``, the coding reward's real programs: one per assert of the first
``--programs`` HumanEval problems' canonical solutions, as :func:`collab.envs.coding.harness.test_program`
builds them. All methods run the same programs in the same process; their order is reversed on every
other repeat.

    cd /work/main && PYTHONPATH=src .venv/bin/python benchmarks/sandbox.py [--workload humaneval --programs 20]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from collab.sandbox import Limits, Pool
from collab.sandbox.limits import interpreter

TEMPLATES = [
    (
        "def add(a, b):\n    return a + b\n",
        ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 5"],
    ),
    (
        "from typing import List\nimport itertools\n\n"
        "def has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
        "    return any(abs(a - b) < threshold for a, b in itertools.combinations(numbers, 2))\n",
        ["assert has_close_elements([1.0, 2.8, 3.0], 0.3)", "assert has_close_elements([1.0, 2.0], 0.5)"],
    ),
    (
        "import re\n\ndef count_words(s: str) -> int:\n    return len(re.findall(r'\\w+', s))\n",
        ["assert count_words('a b  c') == 3", "assert count_words('') == 1"],
    ),
    (
        "import heapq\n\ndef smallest(xs, k):\n    return heapq.nsmallest(k, xs)\n",
        ["assert smallest([5, 1, 4, 2], 2) == [1, 2]", "assert smallest([3], 1) == [4]"],
    ),
]


def programs(n: int) -> list[str]:
    """n programs: solution + all its asserts, alternating between passing and failing variants."""
    out = []
    for i in range(n):
        code, tests = TEMPLATES[i % len(TEMPLATES)]
        passing = tests[:-1] if i % 2 == 0 else tests
        out.append(code + "\n".join(passing) + "\n")
    return out


def humaneval_programs(n_problems: int) -> list[str]:
    """One test program per assert of the first ``n_problems`` HumanEval canonical solutions."""
    from collab.envs.coding.harness import test_program
    from collab.envs.coding.tasks import canonical_code, load_humaneval

    tasks = load_humaneval()[:n_problems]
    return [test_program(t, canonical_code(t), i) for t in tasks for i in range(len(t["tests"]))]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--programs", type=int, default=64, help="programs (toy) or problems (humaneval) (default: %(default)s)"
    )
    ap.add_argument("--workload", choices=["toy", "humaneval"], default="toy", help="(default: %(default)s)")
    ap.add_argument("--workers", type=int, default=os.cpu_count(), help="(default: cpu count, %(default)s)")
    ap.add_argument("--repeats", type=int, default=2, help="timed repeats of each method (default: %(default)s)")
    args = ap.parse_args(argv)

    codes = programs(args.programs) if args.workload == "toy" else humaneval_programs(args.programs)
    pool = Pool(workers=args.workers, limits=Limits(timeout_s=8.0))
    pool.map(codes[:2])  # warm-up (interpreter probe, page cache)

    def sandboxed() -> list[bool]:
        return [r.ok for r in pool.map(codes)]

    def sequential() -> list[bool]:
        return [subprocess.run([sys.executable, "-c", c], capture_output=True).returncode == 0 for c in codes]

    python = pool.limits.python or interpreter()

    def sequential_same() -> list[bool]:
        cmd = [python, "-I", "-S", "-B", "-c"]
        return [subprocess.run(cmd + [c], capture_output=True, env={}).returncode == 0 for c in codes]

    times: dict[str, list[float]] = {"pool": [], "sequential": [], "same": []}
    outcomes = {}
    for rep in range(args.repeats):
        order = [("pool", sandboxed), ("sequential", sequential), ("same", sequential_same)]
        for name, fn in order if rep % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            outcomes[name] = fn()
            times[name].append(time.perf_counter() - start)
    assert outcomes["pool"] == outcomes["sequential"] == outcomes["same"], "methods disagree on which pass"

    rate = {k: len(codes) / min(v) for k, v in times.items()}
    print(
        f"{args.workload}: {len(codes)} programs ({sum(outcomes['pool'])} pass), {os.cpu_count()} CPUs, "
        f"best of {args.repeats}"
    )
    print(f"sandbox interpreter: {python}; baseline interpreter: {sys.executable}")
    print(f"collab Pool (workers={args.workers}, sandboxed): {rate['pool']:7.1f} programs/s")
    print(f"sequential subprocess.run (no limits):     {rate['sequential']:7.1f} programs/s")
    print(f"sequential, sandbox interpreter -I -S -B:  {rate['same']:7.1f} programs/s")
    print(f"ratio pool / sequential: {rate['pool'] / rate['sequential']:.2f}x")


if __name__ == "__main__":
    main()
