"""Write ``--print_config`` of every shipped configuration into a folder, one file each, to diff two checkouts.

    PYTHONPATH=src .venv/bin/python scripts/print_configs.py OUT

Covers every ``--algo`` default, every algorithm x env pair, every preset with each algorithm it is for (the
algorithm its file name starts with; ``collm_*`` presets with both CoLLM variants), every ``conf/compare``
grid config with each algorithm, and the worked examples of docs/examples. A refactor that must not change
behaviour gives the same files: ``diff -r OLD NEW`` (the last line of each file holds the exit code).
"""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENVS = ["coding", "competitive_coding", "debate", "math", "matrix", "minecraft", "writing"]


def runs() -> dict[str, list[str]]:
    from collab.algos import algo_registry

    algos = sorted(algo_registry())
    out = {}
    for algo in algos:
        out[algo] = ["--algo", algo]
        out.update({f"{algo}__{env}": ["--algo", algo, "--data.env", env] for env in ENVS})
    for preset in sorted((ROOT / "conf" / "presets").glob("*.yaml")):
        own = [a for a in algos if preset.stem.startswith(a + "_")]
        for algo in own or [a for a in algos if a.startswith(preset.stem.split("_")[0] + "_")]:
            out[f"preset__{preset.stem}__{algo}"] = ["--algo", algo, "--config", str(preset)]
    for grid in sorted((ROOT / "conf" / "compare").glob("*.yaml")):
        out.update({f"compare__{grid.stem}__{a}": ["--algo", a, "--config", str(grid)] for a in algos})
    examples = ROOT / "docs" / "examples"
    sys.path.insert(0, str(examples))
    out["example__reinforce"] = ["--algo", "reinforce:Reinforce", "--config", str(examples / "reinforce.yaml")]
    out["example__reinforce_guess"] = out["example__reinforce"] + ["--config", str(examples / "guess.yaml")]
    out["example__magrpo_guess"] = ["--algo", "magrpo", "--config", str(examples / "guess.yaml")]
    return out


def main(folder: str) -> None:
    from collab.fit import main as fit

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    for name, args in runs().items():
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(io.StringIO()):
            try:
                code = fit(args + ["--print_config"])
            except SystemExit as e:
                code = e.code
        (out / f"{name}.yaml").write_text(f"{printed.getvalue()}# exit {code}\n")
        print(name, code, flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: scripts/print_configs.py OUT")
    main(sys.argv[1])
