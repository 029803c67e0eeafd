"""Which algorithms a shipped config is for: ``conf/algo/NAME.yaml`` for NAME; ``conf/presets/NAME_*.yaml`` for
the algorithm NAME, and ``conf/presets/collm_*.yaml`` for both CoLLM variants (``collm_cc``, ``collm_dc``); and the
config a command line composes."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRESETS = sorted((ROOT / "conf" / "presets").glob("*.yaml"))


def config_algos(path: Path) -> list[str]:
    from collab.algos import algo_registry

    names = sorted(algo_registry())
    own = [a for a in names if path.stem == a or path.stem.startswith(a + "_")]
    return own or [a for a in names if a.startswith(path.stem.split("_")[0] + "_")]


def preset_runs() -> list[tuple[Path, str]]:
    """(preset, algorithm) for every preset and every algorithm it is for."""
    return [(p, a) for p in PRESETS for a in config_algos(p)]


def composed(algo: str, argv: list[str]) -> dict:
    """The config ``python -m collab.fit --algo ALGO ARGV`` composes (what its ``--print_config`` prints)."""
    import io
    from contextlib import redirect_stdout

    import pytest
    import yaml

    from collab.fit import print_config

    printed = io.StringIO()
    with redirect_stdout(printed), pytest.raises(SystemExit):
        print_config(algo, [*argv, "--print_config"])
    return yaml.safe_load(printed.getvalue())


def overlay(block: dict, entry: dict) -> dict:
    """``entry`` over ``block``, key by key at any depth, an entry's null leaving the block's value: the rule of
    ``model.agent_defaults`` read here on plain mappings, apart from ``collab.policy.specs.with_defaults``."""
    out = dict(block)
    for key, value in entry.items():
        if isinstance(value, dict) and isinstance(block.get(key), dict):
            out[key] = overlay(block[key], value)
        elif value is not None or key not in block:
            out[key] = value
    return out


def effective_agents(model: dict) -> list[dict] | None:
    """The ``model`` section's agents as they train: each entry overlaid on ``model.agent_defaults`` (None: the
    roles', each the block)."""
    agents = model.get("agents")
    return None if agents is None else [overlay(model["agent_defaults"], a) for a in agents]
