"""docs/presets.md against conf/presets/: a section per preset file and a file per section; in each section's
table, a row whose hyper-parameter names a config key in backticks (`` `model.agent_lr` ``) gives as the preset's
value (its first code span) what the composed preset holds (``--print_config``, for every algorithm the preset is
for; ``model.agents[i]`` each agent's values as it trains, its entry over ``model.agent_defaults``), and every value
the preset file sets has such a row (a key of ``model.agent_defaults``: the row of every agent's, ``model.agents[*]``).
Composes the configs only: no model is loaded."""

from __future__ import annotations

import math
import re
from functools import cache

import pytest
import yaml

from tests.support.presets import PRESETS, ROOT, composed, config_algos, effective_agents

DOC = ROOT / "docs" / "presets.md"
HEADER = ["hyper-parameter", "paper (section/table)", "paper's value", "preset's value", "why they differ"]
KEY = re.compile(r"^(model|data|trainer|seed_everything)(\.[\w*\[\]-]+)*$")
SEGMENT = re.compile(r"(\w+)((?:\[[^\]]+\])*)")
REQUIRED = {
    "model.base.name",
    "model.agent_lr",
    "model.ppo.num_epochs",
    "model.ppo.clip",
    "data.num_turns",
    "data.batch_size",
}
"""Rows every table has, whatever the algorithm (the training length besides: ``trainer.max_steps``)."""


def sections() -> dict[str, list[list[str]]]:
    """Each ``## `name``` section's table rows (cells, the header and the rule left out)."""
    found: dict[str, list[list[str]]] = {}
    name = None
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            match = re.match(r"## `([\w-]+)`", line)
            name = match.group(1) if match else None
            if name is not None:
                assert name not in found, f"two sections for {name}"
                found[name] = []
        elif name is not None and line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if cells == HEADER or set("".join(cells)) <= set("-: "):
                continue
            assert len(cells) == len(HEADER), (name, line)
            found[name].append(cells)
    return found


def spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def keyed_rows(rows: list[list[str]]) -> list[tuple[str, str]]:
    """(key, documented value) of each row that names a key."""
    out = []
    for cells in rows:
        keys = [s for s in spans(cells[0]) if KEY.match(s)]
        if keys:
            assert len(keys) == 1, f"one key a row: {cells[0]}"
            values = spans(cells[3])
            assert values, f"{keys[0]}: the preset's value goes in a code span"
            out.append((keys[0], values[0]))
    return out


@cache
def preset_config(preset: str, algo: str) -> dict:
    config = composed(algo, ["--config", str(ROOT / "conf" / "presets" / f"{preset}.yaml")])
    config["model"]["agents"] = effective_agents(config["model"])
    return config


MISSING = object()


def lookup(config, key: str):
    """The value at a dotted ``key``: ``[i]`` an item, ``[*]`` every item (equal, or MISSING), ``[Name]`` the
    callback whose class is Name."""
    values = [config]
    for name, selectors in SEGMENT.findall(key):
        values = [v.get(name, MISSING) if isinstance(v, dict) else MISSING for v in values]
        for selector in re.findall(r"\[([^\]]+)\]", selectors):
            items = values[0]
            if not isinstance(items, list):
                return MISSING
            if selector == "*":
                values = items
            elif selector.isdigit():
                values = [items[int(selector)] if int(selector) < len(items) else MISSING]
            else:
                values = [c for c in items if str(c.get("class_path", "")).endswith("." + selector)][:1] or [MISSING]
    first = values[0] if values else MISSING
    return first if all(v == first for v in values) else MISSING


def same(documented: str, value) -> bool:
    if isinstance(value, str):
        return documented == value
    if isinstance(value, bool) or value is None:
        return documented == yaml.safe_dump(value).splitlines()[0]
    if isinstance(value, (int, float)):
        try:
            return math.isclose(float(documented), value, rel_tol=1e-9)
        except ValueError:
            return False
    return yaml.safe_load(documented) == value


def file_keys(values: dict, prefix: str = "") -> list[str]:
    """The dotted keys a preset file sets (its callbacks left out; agent i's as ``model.agents[i]...``)."""
    out = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        if path == "trainer.callbacks":
            continue
        if isinstance(value, dict) and value:
            out += file_keys(value, path + ".")
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            out += [k for i, v in enumerate(value) for k in file_keys(v, f"{path}[{i}].")]
        else:
            out.append(path)
    return out


def test_a_section_for_every_preset_and_a_preset_for_every_section():
    assert sorted(sections()) == sorted(p.stem for p in PRESETS)


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
def test_the_table_gives_the_presets_values(preset):
    rows = keyed_rows(sections().get(preset.stem, []))
    keys = {key for key, _ in rows}
    assert REQUIRED <= keys and "trainer.max_steps" in keys, (preset.stem, sorted(REQUIRED - keys))
    for key in file_keys(yaml.safe_load(preset.read_text())):
        general = re.sub(r"^model\.(agents\[\d+\]|agent_defaults)", "model.agents[*]", key)
        assert key in keys or general in keys, f"{preset.stem}: the file sets {key}, which no row names"
    for algo in config_algos(preset):
        config = preset_config(preset.stem, algo)
        for key, documented in rows:
            value = lookup(config, key)
            assert value is not MISSING, f"{preset.stem} ({algo}): no single value at {key}"
            assert same(documented, value), f"{preset.stem} ({algo}): {key} is {value!r}, the doc says {documented}"
