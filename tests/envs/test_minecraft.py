"""Minecraft HouseBuild (CoLLM, Section 5.1, E.3, F.3): parser, simulator, spiders, tasks, env, IoU metric.

Every number is counted by hand on a 3x2x2 house placed away from the origin (``SMALL``), or derived
from the raw layer rows of the HouseBuild records independently of the env's voxel code.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest
import torch

from collab.envs import make_env
from collab.envs.minecraft.commands import Attack, Fill, parse_commands
from collab.envs.minecraft.scoring import measure, voxel_iou
from collab.envs.minecraft.tasks import house_from_record, load_houses, shipped_path
from collab.envs.minecraft.threats import Spiders, fight, penalty, spawn
from collab.envs.minecraft.turn import apply
from collab.envs.minecraft.world import empty_world, normalize_block, rectangles
from collab.errors import UserError
from collab.evaluation.metrics import IoU
from tests.support import ScriptedTeam

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "housebuild.json"
needs_shared = pytest.mark.skipif(not SHARED.is_file(), reason=f"{SHARED} is absent")

# World x 10..12, y 64..65, z -5..-4; rows[z][x]. Target: y=64 all stone (6), y=65 at z=-5: stone, air, glass.
SMALL = {
    "task_id": "tiny_hut",
    "inventory": {"S": "stone", "G": "glass", "A": "air"},
    "target_spec": {
        "type": "y_layers",
        "size": [3, 2, 2],
        "layers": [
            {"y": 0, "rows": ["SSS", "SSS"]},
            {"y": 1, "rows": ["SAG", "AAA"]},
        ],
    },
    "bbox": {"from": [10, 64, -5], "to": [12, 65, -4]},
}
EXACT = "/fill 12 64 -4 10 64 -5 stone\n/fill 10 65 -5 10 65 -5 stone\n/fill 12 65 -5 12 65 -5 minecraft:glass"
FLOOR = "/fill 10 64 -5 12 64 -4 stone"


def small_house():
    return house_from_record(SMALL)


def small_env(tmp_path, record=SMALL, **options):
    path = tmp_path / "houses.json"
    path.write_text(json.dumps([record]))
    return make_env("minecraft", dataset=str(path), **{"max_spiders": 0, **options})


def parse(text, max_commands=32):
    return parse_commands(text, small_house(), max_commands, player_atk=16)


# -- world -------------------------------------------------------------------------------------------
def test_layout_rows_are_z_and_characters_are_x():
    house = small_house()
    assert house.palette == ("air", "stone", "glass")
    assert (house.origin, house.corner, house.size) == ((10, 64, -5), (12, 65, -4), (3, 2, 2))
    target = torch.frombuffer(bytearray(house.target), dtype=torch.uint8).view(3, 2, 2)
    assert target[0, 1, 0] == 1 and target[1, 1, 0] == 0 and target[2, 1, 0] == 2  # "SAG" along x at z=-5
    assert int(target[:, 1, 1].sum()) == 0 and int((target[:, 0, :] == 1).sum()) == 6
    assert house.target[house.index((12, 65, -5))] == 2


def test_rectangles_and_block_names():
    grid = [["a", "a", None], ["a", "a", "b"], [None, "b", "b"]]
    assert rectangles(grid) == [(0, 0, 1, 1, "a"), (2, 1, 2, 2, "b"), (1, 2, 1, 2, "b")]  # grows x, then z
    assert normalize_block(" minecraft:Stone_Stairs[facing=north] ") == "stone_stairs"


# -- parser ------------------------------------------------------------------------------------------
def test_valid_commands():
    text = (
        "  /fill 12 65 -4 10 64 -5 minecraft:stone  \n\n   \n/fill 11 64 -5 11 64 -5 glass[foo=bar]\n"
        "/fill 10 64 -5 10 64 -5 air\n/kill\n/kill @e[type=spider]\n/kill @e[type=minecraft:spider, limit=1]\n"
        "/damage @e[type=spider,limit=1] 16 minecraft:player\n/DAMAGE @e[type=spider] 2.5"
    )
    p = parse(text)
    assert p.rejected == ()
    assert p.fills == (
        Fill((10, 64, -5), (12, 65, -4), "stone", 1),
        Fill((11, 64, -5), (11, 64, -5), "glass", 2),
        Fill((10, 64, -5), (10, 64, -5), "air", 0),
    )
    assert p.attacks == (Attack(None), Attack(None), Attack(None), Attack(16.0), Attack(2.5))


@pytest.mark.parametrize(
    "line, reason",
    [
        ("/fill ~ 64 -5 10 64 -5 stone", "relative coordinates (~ or ^) not allowed"),
        ("/fill ^1 64 -5 10 64 -5 stone", "relative coordinates (~ or ^) not allowed"),
        ("/fill 10 64 -5 13 64 -5 stone", "corner (13, 64, -5) outside bbox (10, 64, -5)..(12, 65, -4)"),
        ("/fill 10 63 -5 10 64 -5 stone", "corner (10, 63, -5) outside bbox"),
        ("/fill 10 64 -5 10 64 -5 diamond_block", "unknown block 'diamond_block'; legend: stone, glass, air"),
        ("/fill 10 64 -5 10 64 -5 G", "'G' is a legend letter; write the block name glass"),
        ("/fill 10 64 -5 10 64 stone", "incomplete /fill"),
        ("/fill 10 64 -5 10 64 -5 stone hollow", "extra arguments after the block"),
        ("/fill 10 64 -5 10.5 64 -5 stone", "coordinate '10.5' is not an integer"),
        ("/fill 1_0 64 -5 10 64 -5 stone", "coordinate '1_0' is not an integer"),
        ("/setblock 10 64 -5 stone", "unknown command '/setblock'; allowed: /fill, /kill, /damage"),
        ("fill 10 64 -5 10 64 -5 stone", "not a command"),
        ("Here are my commands:", "not a command"),
        ("```", "markdown code fence"),
        ("```mcfunction", "markdown code fence"),
        ("/kill @p", "/kill targets spiders only"),
        ("/kill @e[type=zombie]", "/kill targets spiders only"),
        ("/damage @e[type=spider,limit=1] 17 minecraft:player", "damage 17 outside 0 < amount <= your attack 16"),
        ("/damage @e[type=spider,limit=1] 0", "outside 0 < amount"),
        ("/damage @e[type=spider,limit=1] lots", "damage amount 'lots' is not a number"),
        ("/damage @p 5", "/damage needs a spider and an amount"),
    ],
)
def test_rejected_lines_carry_their_reason(line, reason):
    p = parse(f"{FLOOR}\n{line}")
    assert len(p.commands) == 1 and len(p.rejected) == 1
    assert p.rejected[0].line == line.strip()
    assert reason in p.rejected[0].reason


def test_command_cap_and_fences():
    p = parse(f"```\n{FLOOR}\n/kill\n/fill 0 0 0 0 0 0 stone\n{FLOOR}\n```", max_commands=2)
    assert [type(c).__name__ for c in p.commands] == ["Fill", "Attack"]  # lines between fences still count
    assert [r.reason for r in p.rejected] == [
        "markdown code fence; output commands only",
        "corner (0, 0, 0) outside bbox (10, 64, -5)..(12, 65, -4)",
        "over the cap of 2 commands",
        "markdown code fence; output commands only",
    ]


# -- simulator ---------------------------------------------------------------------------------------
def test_exact_build_scores_one():
    house = small_house()
    built = apply(house, empty_world(house), [parse(EXACT)])
    assert built == house.target
    m = measure(house, built)
    assert (m.iou, m.coverage, m.redundancy, m.score, m.correct, m.target_blocks) == (1.0, 1.0, 0.0, 1.0, 8, 8)


def test_boxbuilder_records_read_as_housebuild(tmp_path):
    """BoxBuilder (HouseBuild's earlier name in the authors' repository, dataset/box_builder/data.json) names the
    legend ``palette``; its records also carry ``count`` and ``variant``, and a null ``bbox`` (from the origin)."""
    box = {k: v for k, v in SMALL.items() if k != "inventory"}
    box.update(task_id="box_builder_0002", palette=SMALL["inventory"], count={"S": 7, "G": 1, "A": 4})
    moved = {**box, "task_id": "box_builder_0101", "bbox": None, "variant": "flat_north"}
    path = tmp_path / "data.json"
    path.write_text(json.dumps([box, moved]))
    for dataset in (str(path), f"boxbuilder:{path}"):
        env = make_env("minecraft", dataset=dataset, max_spiders=0)
        first, second = env.tasks("train")[0], env.tasks("eval")[0]
        assert house_from_record(first) == house_from_record({**SMALL, "task_id": "box_builder_0002"})
        assert house_from_record(second).origin == (0, 0, 0) and second["variant"] == "flat_north"
        assert env.step(env.reset(first), [EXACT, ""]).rewards[0] == pytest.approx(1.0)
        ref = make_env("minecraft", dataset=dataset, reward_mode="reference", max_spiders=0, limited_resource=False)
        assert ref.step(ref.reset(first), [EXACT, ""]).rewards[0] == pytest.approx(1.0)  # every position right
    with pytest.raises(UserError, match=r"^BoxBuilder \(published on .*file not found: .*none.json") as err:
        make_env("minecraft", dataset=f"boxbuilder:{tmp_path}/none.json")
    assert "\n" not in str(err.value)


def test_measures_by_hand(tmp_path):
    env = small_env(tmp_path)
    step = env.step(env.reset(SMALL), ["/fill 10 64 -5 12 65 -4 stone", ""])
    # 12 stone placed; target: 7 stone + 1 glass. Right: 7; wrong: 5 (4 over air, 1 over glass).
    assert step.info["coverage"] == pytest.approx(7 / 8)
    assert step.info["redundancy"] == pytest.approx(5 / 12)
    assert step.info["iou"] == pytest.approx(7 / 12)  # union: all 12 positions
    assert step.info["score"] == pytest.approx(7 / 12)  # equal positions over the bbox
    assert step.rewards == pytest.approx((7 / 8 - 0.5 * 5 / 12,) * 2)


def test_agents_write_in_order(tmp_path):
    env = small_env(tmp_path)
    glass, stone = FLOOR.replace("stone", "glass"), FLOOR
    last_stone = env.step(env.reset(SMALL), [glass, stone])
    assert last_stone.info["coverage"] == pytest.approx(6 / 8) and last_stone.info["redundancy"] == 0.0
    assert last_stone.info["iou"] == pytest.approx(6 / 8)
    last_glass = env.step(env.reset(SMALL), [stone, glass])
    assert last_glass.info["coverage"] == 0.0 and last_glass.info["redundancy"] == 1.0
    assert last_glass.info["iou"] == 0.0  # union: 6 glass + the 2 target blocks of y=65
    assert last_glass.rewards[0] == pytest.approx(-0.5)
    built, _ = env.voxels(last_glass.state)
    assert bool((built[:, 0, :] == 2).all())  # glass everywhere on y=64


def test_world_persists_and_states_stay_values(tmp_path):
    env = small_env(tmp_path, horizon=3)
    s1 = env.step(env.reset(SMALL), [FLOOR, ""]).state
    assert isinstance(s1.memory["world"], bytes)
    a = env.step(s1, ["", "/fill 10 65 -5 10 65 -5 stone\n/fill 12 65 -5 12 65 -5 glass"])
    b = env.step(s1, ["", ""])  # branching the same state again: s1 was not changed by the first child
    assert a.info["iou"] == 1.0 and b.info["iou"] == pytest.approx(6 / 8)
    assert env.step(s1, ["", ""]).state == b.state


# -- spiders (E.3 simulator, F.3 penalty) ------------------------------------------------------------
def test_fight_and_penalty_by_hand():
    spiders = Spiders((3, 2, 4), hp=16)
    assert spiders.total_damage == 9
    one_kill = fight(spiders, [Attack(None)])
    assert (one_kill.killed, one_kill.damage) == (1, 6)
    assert penalty(one_kill.damage, 20) == pytest.approx(6 / 20 * 0.2)
    two_hits = fight(spiders, [Attack(10), Attack(10), Attack(15)])  # 16 -> 6 -> dead (overkill lost); 16 -> 1
    assert (two_hits.killed, two_hits.damage) == (1, 6)
    all_dead = fight(spiders, [Attack(16), Attack(None), Attack(16), Attack(None)])
    assert (all_dead.killed, all_dead.damage, all_dead.wasted) == (3, 0, 1)
    assert penalty(0, 20) == 0.0 and penalty(25, 20) == pytest.approx(0.2) and penalty(5, 0) == pytest.approx(0.2)


def test_spawn_is_seeded_and_in_range():
    draws = [spawn(0, "t", turn, 0, 3, 3, 16) for turn in range(30)]
    assert draws == [spawn(0, "t", turn, 0, 3, 3, 16) for turn in range(30)]
    assert {d.num for d in draws} == {0, 1, 2, 3}
    assert {a for d in draws for a in d.attacks} == {1, 2, 3}
    assert draws != [spawn(1, "t", turn, 0, 3, 3, 16) for turn in range(30)]
    assert spawn(0, "t", 0, 0, 0, 3, 16).num == 0
    assert all(spawn(0, "t", turn, 2, 2, 1, 16).attacks == (1, 1) for turn in range(5))


def test_hp_and_penalty_over_turns(tmp_path):
    env = small_env(tmp_path, min_spiders=2, max_spiders=2, spider_atk=1)  # 2 spiders of attack 1 every turn
    state = env.reset(SMALL)
    assert (
        "There are 2 spiders nearby; you have 20 HP. Spider attack list: [1, 1], total damage dmg=2"
        in state.histories[0][-1]["content"]
    )
    turns = [
        (["", ""], 2, 18, 2 / 20 * 0.2),  # not repelled
        (["/kill", "/damage @e[type=spider,limit=1] 16 minecraft:player"], 0, 18, 0.0),  # repelled
        (["/kill @e[type=spider,limit=1]", ""], 1, 17, 1 / 18 * 0.2),  # one of two killed
        (["/damage @e[type=spider,limit=1] 8\n/damage @e[type=spider,limit=1] 8", ""], 1, 16, 1 / 17 * 0.2),
    ]
    for t, (actions, damage, hp, pen) in enumerate(turns):
        step = env.step(state, actions)
        assert step.info["damage"] == damage and step.info["hp"] == pytest.approx(hp / 20), t
        assert step.info["penalty"] == pytest.approx(pen) and step.rewards[0] == pytest.approx(-pen)
        state = step.state
        if t == 0:
            assert "you took 2 damage. HP 18/20." in state.histories[1][-1]["content"]
    assert state.done and state.histories[0][-1]["role"] == "assistant"
    halved = small_env(tmp_path, min_spiders=2, max_spiders=2, spider_atk=1, spider_penalty=0.1)
    assert halved.step(halved.reset(SMALL), ["", ""]).info["penalty"] == pytest.approx(2 / 20 * 0.1)


# -- environment -------------------------------------------------------------------------------------
def test_defaults_and_shipped_houses():
    env = make_env("minecraft")
    assert env.horizon == 4 and env.n_agents == 2 and env.reward_max == 1.0 and env.joint_reward
    assert [r.name for r in env.roles] == ["player1", "player2"] and env.roles[0].max_new_tokens == 256
    train, evals = env.tasks("train"), env.tasks("eval")
    assert (len(train), len(evals)) == (8, 4)
    ids = [t["task_id"] for t in [*train, *evals]]
    assert len(set(ids)) == 12
    for task in [*train, *evals]:
        size = house_from_record(task).size
        assert (4, 4, 4) <= tuple(sorted(size)) and max(size) <= 7
    assert len(make_env("minecraft", train_split="[0:8]", eval_split="[8:10]").tasks("eval")) == 2


def test_prompt_follows_e3(tmp_path):
    env = small_env(tmp_path, max_commands=5)
    first, second = env.observe(SMALL)
    assert first.startswith("You are Player 1 in a 2-person Minecraft building team.")
    assert second.startswith("You are Player 2 in a 2-person")
    assert "Available blocks (use ONLY these): stone, glass" in first
    assert "- y=64: {(10, 64, -5, 12, 64, -4 stone)}" in first
    assert "- y=65: {(10, 65, -5, 10, 65, -5 stone), (12, 65, -5, 12, 65, -5 glass)}" in first
    assert "- from: [10, 64, -5]\n- to: [12, 65, -4]" in first
    assert "There are no spiders nearby" in first and "At most 5 commands." in first


def test_feedback_lists_what_is_missing_and_wrong(tmp_path):
    env = small_env(tmp_path)
    step = env.step(env.reset(SMALL), [FLOOR + "\n/fill 0 0 0 0 0 0 stone", "/fill 11 65 -5 11 65 -5 glass"])
    info = step.info
    assert (info["commands"], info["rejected"]) == (2.0, 1.0)
    assert info["coverage"] == pytest.approx(6 / 8) and info["redundancy"] == pytest.approx(1 / 7)
    assert info["iou"] == pytest.approx(6 / 9) and info["score"] == pytest.approx(9 / 12)
    mine, theirs = (h[-1]["content"] for h in step.state.histories)
    for text in (mine, theirs):
        assert text.startswith("Turn 1 result: IoU 67%, coverage 75% (6/8 target blocks), redundancy 14% (1 of 7")
        assert (
            "Still missing (place them):\n- y=65: (10, 65, -5, 10, 65, -5 stone), (12, 65, -5, 12, 65, -5 glass)"
            in text
        )
        assert "Wrong blocks (replace them, air clears):\n- y=65: (11, 65, -5, 11, 65, -5 glass) should be air" in text
    assert "'/fill 0 0 0 0 0 0 stone': corner (0, 0, 0) outside bbox" in mine and "outside bbox" not in theirs


def test_voxels_and_iou_metric_by_hand(tmp_path):
    env = small_env(tmp_path)
    state = env.step(env.reset(SMALL), [FLOOR, ""]).state
    built, target = env.voxels(state)
    assert built.shape == target.shape == (3, 2, 2) and built.dtype == torch.uint8
    assert float(voxel_iou(built, target)) == pytest.approx(6 / 8)
    a_built = torch.tensor([[1, 2, 0], [2, 0, 3]])
    a_target = torch.tensor([[1, 1, 0], [2, 0, 0]])
    assert float(voxel_iou(a_built, a_target)) == pytest.approx(2 / 4)  # same block at 2 cells; 4 non-air in either
    assert float(voxel_iou(torch.zeros(2, 2), torch.zeros(2, 2))) == 1.0
    with pytest.raises(ValueError, match="differ in shape"):
        voxel_iou(torch.zeros(2, 2), torch.zeros(2, 3))
    metric = IoU()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchmetrics warns about compute() before update()
        assert float(metric.compute()) == 0.0
    metric.update(a_built, a_target)
    metric.update([built, a_target], [target, a_target])
    assert float(metric.compute()) == pytest.approx((0.5 + 6 / 8 + 1.0) / 3)


def test_evaluate_reports_iou(tmp_path):
    from collab.evaluation.heldout import evaluate

    env = small_env(tmp_path, horizon=2)
    script = {(0, 0): FLOOR, (1, 0): "", (0, 1): "", (1, 1): "/fill 12 65 -5 12 65 -5 glass"}
    team = ScriptedTeam(lambda agent, messages: script[(agent, len(messages) // 2)])  # 1 message at turn 0, 3 at turn 1
    metrics, episodes = evaluate(team, env, env.tasks("eval"), num_samples=2, ks=[1])
    assert [len(ep.steps) for ep in episodes[0]] == [2, 2]
    assert metrics["eval/iou"] == pytest.approx(7 / 8) and metrics["eval/env/iou"] == pytest.approx(7 / 8)
    assert metrics["eval/env/hp"] == 1.0 and metrics["eval/return"] == pytest.approx(6 / 8 + 7 / 8)


# -- task files --------------------------------------------------------------------------------------
def cell_commands(record):
    """One /fill per non-air cell, straight from the record's rows (rows[z][x]), not through the env's grid."""
    origin = (record.get("bbox") or {}).get("from", [0, 0, 0])
    out = []
    for item in record["target_spec"]["layers"]:
        for z, row in enumerate(item["rows"]):
            for x, letter in enumerate(row):
                block = record["inventory"][letter]
                if block != "air":
                    p = (origin[0] + x, origin[1] + item["y"], origin[2] + z)
                    out.append(f"/fill {p[0]} {p[1]} {p[2]} {p[0]} {p[1]} {p[2]} {block}")
    return out


def check_records(records, env):
    for record in records:
        house = house_from_record(record)
        ids = list(house.target)
        for block in set(record["inventory"].values()) - {"air"}:  # the file's counts, by block
            want = sum(n for letter, n in record.get("count", {}).items() if record["inventory"][letter] == block)
            assert not record.get("count") or ids.count(house.palette.index(block)) == want, (record["task_id"], block)
        parsed = parse_commands("\n".join(cell_commands(record)), house, 10**6, 16)
        assert parsed.rejected == ()
        m = measure(house, apply(house, empty_world(house), [parsed]))
        assert (m.iou, m.coverage, m.redundancy, m.score) == (1.0, 1.0, 0.0, 1.0), record["task_id"]
        # The prompt's rectangles, split between the two players, rebuild the house exactly.
        prompt = env.observe(record)[0]
        boxes = re.findall(
            r"\((-?\d+), (-?\d+), (-?\d+), (-?\d+), (-?\d+), (-?\d+) ([a-z_]+)\)", prompt.split("WORLD bbox")[0]
        )
        cmds = ["/fill " + " ".join(b) for b in boxes]
        step = env.step(env.reset(record), ["\n".join(cmds[::2]), "\n".join(cmds[1::2])])
        assert (step.info["iou"], step.info["coverage"], step.info["score"], step.info["rejected"]) == (
            1.0,
            1.0,
            1.0,
            0.0,
        )


def test_every_shipped_house_rebuilds_exactly():
    env = make_env("minecraft", max_spiders=0, max_commands=200, horizon=1)
    records = load_houses(shipped_path())
    assert len(records) == 12
    check_records(records, env)


@needs_shared
def test_every_paper_task_rebuilds_exactly():
    env = make_env("minecraft", dataset=str(SHARED), max_spiders=0, max_commands=200, horizon=1)
    records = [*env.tasks("train"), *env.tasks("eval")]
    assert len(records) == 10
    check_records(records, env)
    shipped = {json.dumps(r["target_spec"]) for r in load_houses(shipped_path())}
    assert not shipped & {json.dumps(r["target_spec"]) for r in records}  # collab's houses are its own


@needs_shared
def test_paper_splits():
    env = make_env("minecraft", dataset=str(SHARED), train_split="[0:8]", eval_split="[8:10]")
    assert [t["task_id"] for t in env.tasks("eval")] == ["house_build_0108", "house_build_0109"]
    assert len(env.tasks("train")) == 8
    default = make_env("minecraft", dataset=str(SHARED))
    assert [t["task_id"] for t in default.tasks("eval")] == ["house_build_0108", "house_build_0109"]


def broken(**changes):
    record = json.loads(json.dumps(SMALL))
    for key, value in changes.items():
        if value is None:
            del record[key]
        else:
            record[key] = value
    return record


def spec(**changes):
    return {**SMALL["target_spec"], **changes}


@pytest.mark.parametrize(
    "record, message",
    [
        (broken(target_spec=None), "no 'target_spec' field (it has: bbox, inventory, task_id); required:"),
        (broken(target_spec=spec(type="x_layers")), "target_spec.type must be 'y_layers'"),
        (broken(target_spec=spec(size=[3, 2])), "target_spec.size must be a list of 3 integers"),
        (
            broken(target_spec=spec(layers=[{"y": 0, "rows": ["SSSS", "SSS"]}])),
            "layer y=0 row 0 must be a string of 3 letters",
        ),
        (broken(target_spec=spec(layers=[{"y": 0, "rows": ["SSS"]}])), "layer y=0 must have 2 rows"),
        (broken(target_spec=spec(layers=[{"y": 0, "rows": ["SQS", "SSS"]}])), "uses 'Q', not in the inventory"),
        (broken(target_spec=spec(layers=[{"y": 2, "rows": ["SSS", "SSS"]}])), "expected a distinct integer in 0..1"),
        (
            broken(bbox={"from": [0, 0, 0], "to": [3, 1, 1]}),
            "bbox spans [4, 2, 2] blocks but target_spec.size is [3, 2, 2]",
        ),
        (broken(inventory={"SS": "stone"}), "must map one letter to a block name"),
    ],
)
def test_bad_records_are_one_line_user_errors(tmp_path, record, message):
    with pytest.raises(UserError) as err:
        small_env(tmp_path, record=record)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert "houses.json: record 0" in str(err.value)  # names the file and the record


def test_bad_options_are_user_errors(tmp_path):
    for options, message in [
        ({"dataset": str(tmp_path / "nope.json")}, "data file not found"),
        ({"train_split": "[a:b]"}, "bad split"),
        ({"eval_split": "[20:30]"}, "the eval split '[20:30]' of 12 HouseBuild records is empty"),
        ({"n_agents": 0}, "n_agents must be >= 1"),
        ({"min_spiders": 3, "max_spiders": 2}, "min_spiders <= max_spiders"),
        ({"bogus": 1}, "bad option for env 'minecraft'"),
    ]:
        with pytest.raises(UserError, match=re.escape(message)) as err:
            make_env("minecraft", **options)
        assert "\n" not in str(err.value)
    with pytest.raises(UserError, match="unknown split 'test'"):
        make_env("minecraft").tasks("test")


def _dialog(turns: int, final: bool) -> tuple:
    head = ({"role": "system", "content": "sys"}, {"role": "user", "content": "o0"})
    body = []
    for t in range(turns):
        body += [{"role": "assistant", "content": f"a{t}"}, {"role": "user", "content": f"o{t + 1}"}]
    if final:
        body.append({"role": "assistant", "content": f"a{turns}"})
    return head + tuple(body)


def test_history_window_keeps_the_opening_and_the_last_turns():
    from collab.envs.base import window

    contents = lambda h: [m["content"] for m in h]  # noqa: E731
    assert contents(window(_dialog(3, False), None)) == ["sys", "o0", "a0", "o1", "a1", "o2", "a2", "o3"]
    assert contents(window(_dialog(3, False), 1)) == ["sys", "o0", "a2", "o3"]
    assert contents(window(_dialog(3, False), 2)) == ["sys", "o0", "a1", "o2", "a2", "o3"]
    assert window(_dialog(3, False), 3) == _dialog(3, False) == window(_dialog(3, False), 9)
    assert contents(window(_dialog(2, True), 1)) == ["sys", "o0", "a2"]  # the final response is a turn
    assert contents(window(_dialog(2, True), 2)) == ["sys", "o0", "a1", "o2", "a2"]
    assert window(_dialog(0, False), 1) == _dialog(0, False)


def test_players_keep_the_e3_prompt_and_their_last_turn(tmp_path):
    """Default history_window 1: [E.3 prompt, own last commands, feedback on them] at every turn."""
    env, whole = small_env(tmp_path), small_env(tmp_path, history_window=None)
    state, full = env.reset(SMALL), whole.reset(SMALL)
    first = state.histories[0][0]["content"]
    for t in range(3):
        actions = [f"/fill 0 64 0 0 64 {t} stone", f"# turn {t}"]
        state, full = env.step(state, actions).state, whole.step(full, actions).state
        for i in range(2):
            h = state.histories[i]
            assert [m["role"] for m in h] == ["user", "assistant", "user"]
            assert h[0]["content"] == first.replace("Player 1", f"Player {i + 1}")
            assert h[1]["content"] == actions[i] and h[2] == full.histories[i][-1]
        assert len(full.histories[0]) == 1 + 2 * (t + 1)
    with pytest.raises(UserError, match="history_window must be >= 1"):
        small_env(tmp_path, history_window=0)
