"""HouseBuild's ``reward_mode="reference"``: the reward of the authors' code, quirk by quirk.

Every expected reward below was computed by hand from the reference's rules (written in the comment of
each case), never by running collab. The house (``HUT``) is 2 x 2 x 2 at x 10..11, y 0..1, z -5..-4:

    y=0: rows ["SS", "SS"]  -> P1 (10,0,-5) P2 (11,0,-5) P3 (10,0,-4) P4 (11,0,-4): stone
    y=1: rows ["GA", "AA"]  -> P5 (10,1,-5): glass; P6 (11,1,-5) P7 (10,1,-4) P8 (11,1,-4): air

Reward = (positions holding their target block, air included) / 8 - spider penalty. An empty bbox
already matches P6-P8: 3/8. Budgets per player (2 players): stone ceil(4/2) + 4//4 = 3, glass
ceil(1/2) + 1//4 = 1. Spiders: ``spider_atk=1`` makes every attack 1 (uniform in 1..1), so
3 spiders deal 3 and the penalty is min(1, 3/5) * 0.1 = 0.06 at the reference's 5 HP.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from collab.envs import make_env
from collab.envs.minecraft.reference import command_lines
from collab.errors import UserError

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "housebuild.json"
needs_shared = pytest.mark.skipif(not SHARED.is_file(), reason=f"{SHARED} is absent")

HUT = {
    "task_id": "hut",
    "inventory": {"S": "stone", "G": "glass", "A": "air"},
    "target_spec": {
        "type": "y_layers",
        "size": [2, 2, 2],
        "layers": [
            {"y": 0, "rows": ["SS", "SS"]},
            {"y": 1, "rows": ["GA", "AA"]},
        ],
    },
    "bbox": {"from": [10, 0, -5], "to": [11, 1, -4]},
}
FLOOR = "/fill 10 0 -5 11 0 -4 stone"  # P1-P4, volume 4
GLASS = "/fill 10 1 -5 10 1 -5 glass"  # P5
ROW_A = "/fill 10 0 -5 11 0 -5 stone"  # P1, P2 (volume 2)
ROW_B = "/fill 10 0 -4 11 0 -4 stone"  # P3, P4 (volume 2)
SPIDERS = {"max_spiders": 3, "spider_atk": 1}  # attacks (1, 1, 1): 3 damage


def hut_env(tmp_path, **options):
    path = tmp_path / "hut.json"
    path.write_text(json.dumps([HUT]))
    return make_env(
        "minecraft",
        dataset=str(path),
        reward_mode="reference",
        **{"max_spiders": 0, "limited_resource": False, **options},
    )


def reward(tmp_path, actions, **options):
    env = hut_env(tmp_path, **options)
    return env.step(env.reset(HUT), list(actions)).rewards[0]


# (actions of player 1 and player 2, env options, expected reward); arithmetic in each comment.
CASES = {
    # -- the score: matching positions over the whole bbox, air included (not IoU) --
    "nothing built": (["", ""], {}, 3 / 8),  # P6-P8 are air in both: 3/8
    "exact house": ([FLOOR, GLASS], {}, 8 / 8),  # P1-P4 stone, P5 glass, P6-P8 air: 8/8
    "floor only": ([FLOOR, ""], {}, 7 / 8),  # P1-P4 + P6-P8: 7/8
    "everything stone": (["/fill 10 0 -5 11 1 -4 stone", ""], {}, 4 / 8),  # P1-P4 right, P5-P8 wrong: 4/8
    "all air": (["/fill 10 0 -5 11 1 -4 air", ""], {}, 3 / 8),  # air fill = nothing: P6-P8: 3/8
    # -- order of writes: player 1's fills, then player 2's; in order within a player --
    "player 2 overwrites": ([FLOOR, FLOOR.replace("stone", "glass")], {}, 3 / 8),  # floor glass: P6-P8: 3/8
    "player 2 writes last": ([FLOOR.replace("stone", "glass"), FLOOR], {}, 7 / 8),  # floor stone: 7/8
    "later line wins": ([FLOOR + "\n/fill 11 0 -4 11 0 -4 air", ""], {}, 6 / 8),  # P4 cleared: P1-P3 + P6-P8: 6/8
    # -- line extraction: list markers, fences --
    "numbered list": (["1. " + FLOOR + "\n2) " + GLASS, ""], {}, 8 / 8),  # markers stripped: both fills: 8/8
    "bullets": (["- " + FLOOR, "* " + GLASS], {}, 8 / 8),  # "- " and "* " stripped: 8/8
    "first fenced block only": (["Here:\n```bash\n" + FLOOR + "\n```\n" + GLASS, ""], {}, 7 / 8),
    # only the block is read ("bash" dropped as its tag), the glass after it is ignored: P1-P4 + P6-P8: 7/8
    "one fence is a bad line": (["```\n" + FLOOR, GLASS], {}, 8 / 8),  # one fence: whole text read, "```"
    # rejected, the floor accepted; player 2's glass: 8/8
    # -- command names: slash optional, any case --
    "fill without slash": (["fill 10 0 -5 11 0 -4 stone", ""], {}, 7 / 8),  # accepted: 7/8
    "FILL and / fill": (["FILL 10 0 -5 11 0 -5 stone\n/ fill 10 0 -4 11 0 -4 stone", ""], {}, 7 / 8),  # P1-P4: 7/8
    "setblock unknown": (["/setblock 10 0 -5 stone", ""], {}, 3 / 8),  # rejected: 3/8
    # -- coordinates: Python integers, inside the bbox, any corner order --
    "plus sign and underscore": (["/fill +10 0 -5 1_1 0 -4 stone", ""], {}, 7 / 8),  # int("1_1") = 11: 7/8
    "reversed corners": (["/fill 11 0 -4 10 0 -5 stone", ""], {}, 7 / 8),  # same box: 7/8
    "relative coordinates": (["/fill ~ 0 -5 11 0 -4 stone", ""], {}, 3 / 8),  # rejected: 3/8
    "decimal coordinate": (["/fill 10.0 0 -5 11 0 -4 stone", ""], {}, 3 / 8),  # int("10.0") fails: 3/8
    "corner outside bbox": (["/fill 10 0 -5 12 0 -4 stone", ""], {}, 3 / 8),  # x=12 > 11: rejected: 3/8
    "too few arguments": (["/fill 10 0 -5 11 0 stone", ""], {}, 3 / 8),  # 7 tokens < 8: 3/8
    # -- blocks: exact legend names, minecraft: prefix only --
    "minecraft prefix": (["/fill 10 0 -5 11 0 -4 minecraft:stone", ""], {}, 7 / 8),  # prefix dropped: 7/8
    "capitalized block": (["/fill 10 0 -5 11 0 -4 Stone", ""], {}, 3 / 8),  # "Stone" != "stone": 3/8
    "block states": (["/fill 10 0 -5 11 0 -4 stone[x=1]", ""], {}, 3 / 8),  # states kept, not a legend name: 3/8
    "legend letter": (["/fill 10 0 -5 11 0 -4 S", ""], {}, 3 / 8),  # "S" is not a block name: 3/8
    "block off the legend": (["/fill 10 0 -5 11 0 -4 dirt", ""], {}, 3 / 8),  # not allowed: 3/8
    "fill mode": (["/fill 10 0 -5 11 0 -4 stone replace", ""], {}, 3 / 8),  # 9 tokens: modes rejected: 3/8
    # -- the per-player command cap (300 by default; kills count, rejected lines do not) --
    "300 kills then a fill": (["/kill\n" * 300 + FLOOR, ""], {}, 3 / 8),  # the fill is the 301st: rejected: 3/8
    "299 kills then a fill": (["/kill\n" * 299 + FLOOR, ""], {}, 7 / 8),  # the 300th: accepted: 7/8
    "cap of 1": ([FLOOR + "\n" + GLASS, ""], {"max_commands": 1}, 7 / 8),  # glass past the cap: 7/8
    "rejected lines are free": (["junk\n" + FLOOR, ""], {"max_commands": 1}, 7 / 8),  # junk rejected, floor 1st: 7/8
    "caps are per player": ([FLOOR, GLASS], {"max_commands": 1}, 8 / 8),  # one command each: 8/8
    # -- block budgets (limited_resource): stone 3, glass 1 per player and turn --
    "floor over budget": ([FLOOR, GLASS], {"limited_resource": True}, 4 / 8),  # 4 > 3: rejected; P5-P8: 4/8
    "budget filled exactly": (
        [ROW_A + "\n/fill 10 0 -4 10 0 -4 stone\n/fill 11 0 -4 11 0 -4 stone", ""],
        {"limited_resource": True},
        6 / 8,
    ),  # 2 + 1 = 3 ok, + 1 = 4 > 3 rejected:
    # P1-P3 + P6-P8: 6/8
    "budgets are per player": ([ROW_A, ROW_B + "\n" + GLASS], {"limited_resource": True}, 8 / 8),
    # player 1: 2 <= 3; player 2: stone 2 <= 3, glass 1 <= 1: 8/8
    "overlap is charged": (
        [ROW_A + "\n" + ROW_A + "\n/fill 10 0 -4 10 0 -4 stone", ""],
        {"limited_resource": True},
        6 / 8,
    ),  # 2, then 2 + 2 = 4 > 3 rejected, then 2 + 1 = 3: P1-P3 + P6-P8: 6/8
    "a rejected fill charges nothing": (
        [FLOOR + "\n" + ROW_A + "\n/fill 10 0 -4 10 0 -4 stone", ""],
        {"limited_resource": True},
        6 / 8,
    ),  # 4 > 3 rejected (0 used), 2, 3: 6/8
    "air is free": (
        ["/fill 10 0 -5 11 1 -4 air\n" + ROW_A + "\n" + ROW_B, ""],
        {"limited_resource": True},
        5 / 8,
    ),  # air 8 free; stone 2 ok, 2 + 2 = 4 > 3 rejected: P1, P2 + P6-P8: 5/8
    "glass budget": (["/fill 10 1 -5 11 1 -5 glass", ""], {"limited_resource": True}, 3 / 8),  # 2 > 1: 3/8
    # -- spiders: 3 x attack 1 = 3 damage, penalty min(1, 3/5) * 0.1 = 0.06 unless some /kill is accepted --
    "spiders, no kill": ([FLOOR, ""], SPIDERS, 7 / 8 - 0.06),  # 0.875 - 0.06 = 0.815
    "spiders, player 2 kills": ([FLOOR, "/kill"], SPIDERS, 7 / 8),  # penalty cancelled: 0.875
    "kill with any target": ([FLOOR + "\nkill @p", ""], SPIDERS, 7 / 8),  # "kill @p" accepted, cancels: 0.875
    "one kill cancels all": (["/kill @e[type=spider,limit=1]", ""], {**SPIDERS, "max_spiders": 6}, 3 / 8),
    # 6 spiders, one kill line: no penalty: 3/8
    "damage is not a command": (
        [FLOOR, "/damage @e[type=spider,limit=1] 16 minecraft:player"],
        SPIDERS,
        7 / 8 - 0.06,
    ),  # rejected: 0.815
    "kill past the cap": ([FLOOR + "\n/kill", ""], {**SPIDERS, "max_commands": 1}, 7 / 8 - 0.06),  # rejected: 0.815
    "kill eaten as a fence tag": (["```\nkill\n" + FLOOR + "\n```", ""], SPIDERS, 7 / 8 - 0.06),
    # "kill" is the fenced block's first one-word line: dropped as a language tag: 0.875 - 0.06 = 0.815
    "damage capped at hp": ([FLOOR, ""], {**SPIDERS, "max_spiders": 6}, 7 / 8 - 0.1),  # min(1, 6/5) = 1: 0.775
    "more hp": ([FLOOR, ""], {**SPIDERS, "player_hp": 10}, 7 / 8 - 0.03),  # 3/10 * 0.1 = 0.03: 0.845
    "paper weight": ([FLOOR, ""], {**SPIDERS, "spider_penalty": 0.2}, 7 / 8 - 0.12),  # 3/5 * 0.2 = 0.12: 0.755
    "one player, no penalty": ([FLOOR], {**SPIDERS, "n_agents": 1}, 7 / 8),  # one-agent reward: 0.875
}


@pytest.mark.parametrize("name", list(CASES))
def test_reference_reward_by_hand(tmp_path, name):
    actions, options, expected = CASES[name]
    assert reward(tmp_path, actions, **options) == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_every_turn_starts_from_an_empty_bbox(tmp_path):
    env = hut_env(tmp_path, horizon=3, **SPIDERS)
    s1 = env.step(env.reset(HUT), [FLOOR, ""])
    assert s1.rewards[0] == pytest.approx(7 / 8 - 0.06, rel=1e-9)  # 0.815
    s2 = env.step(s1.state, ["", GLASS])  # the floor is gone: P5 + P6-P8 = 4/8, and the penalty again
    assert s2.rewards[0] == pytest.approx(4 / 8 - 0.06, rel=1e-9)  # 0.44
    assert s2.info["hp"] == pytest.approx((5 - 3) / 5, rel=1e-9)  # no health carried over: 5 - 3 again
    s3 = env.step(s2.state, [FLOOR + "\n" + GLASS, "/kill"])  # everything at once, spiders killed: 1.0
    assert s3.rewards[0] == pytest.approx(1.0, rel=1e-9) and s3.done
    built, target = env.voxels(s3.state)
    assert bool((built == target).all())


def test_budgets_restart_every_turn(tmp_path):
    env = hut_env(tmp_path, horizon=2, limited_resource=True)
    actions = [ROW_A + "\n/fill 10 0 -4 10 0 -4 stone", ""]  # 3 of 3 stone, every turn: P1-P3 + P6-P8 = 6/8
    s1 = env.step(env.reset(HUT), actions)
    s2 = env.step(s1.state, actions)
    assert s1.rewards[0] == pytest.approx(6 / 8, rel=1e-9) and s2.rewards[0] == pytest.approx(6 / 8, rel=1e-9)


def test_feedback_is_the_score(tmp_path):
    env = hut_env(tmp_path, **SPIDERS)
    step = env.step(env.reset(HUT), [FLOOR, ""])
    for history in step.state.histories:
        assert history[-1]["content"].startswith("Score feedback: turn 2 of 4. Previous reward: 0.8150.")
    # One player: the reward has no spider term (0.875), the feedback's recomputed reward has it (0.815).
    solo = hut_env(tmp_path, n_agents=1, **SPIDERS)
    step = solo.step(solo.reset(HUT), [FLOOR])
    assert step.rewards[0] == pytest.approx(7 / 8, rel=1e-9)
    assert "Previous reward: 0.8150." in step.state.histories[0][-1]["content"]


def test_reference_lines():
    text = "Sure!\n```mcfunction\n1. /fill 0 0 0 1 1 1 stone\n\n  - kill\n```\nthanks"
    assert command_lines(text) == ["/fill 0 0 0 1 1 1 stone", "kill"]
    assert command_lines("```\nkill\n/kill\n```") == ["/kill"]  # the one-word first line is taken for a tag
    assert command_lines("a\n```\nb") == ["a", "```", "b"]  # one fence: the whole text


def test_reference_defaults_and_prompt(tmp_path):
    env = make_env("minecraft", reward_mode="reference")
    assert (env.max_commands, env.player_hp, env.spider_penalty, env.limited_resource) == (300, 5, 0.1, True)
    assert env.roles[0].max_new_tokens == 512 and env.horizon == 4
    rng = random.Random(0)  # the reference draws its spiders once: random.Random(seed).randint(1, 3), 3 times
    assert (
        env.spiders("any", 0).attacks == env.spiders("other", 3).attacks == tuple(rng.randint(1, 3) for _ in range(3))
    )
    assert make_env("minecraft", reward_mode="reference", n_agents=1).max_commands == 600
    prompt = hut_env(tmp_path, limited_resource=True, **SPIDERS).observe(HUT)[0]
    assert "Allowed commands: /fill and /kill\n" in prompt and "/damage" not in prompt
    assert "3 spiders nearby; you have 5 HP. Spider attack list: [1, 1, 1]" in prompt and "/kill" in prompt
    assert "- stone: 3\n- glass: 1" in prompt and "At most 300 commands." in prompt
    paper = make_env("minecraft")  # the default mode is unchanged
    assert (paper.reward_mode, paper.max_commands, paper.player_hp, paper.spider_penalty) == ("paper", 32, 20, 0.2)


@needs_shared
def test_reference_task_by_hand():
    env = make_env("minecraft", dataset=str(SHARED), reward_mode="reference")
    task = env.tasks("train")[0]
    assert task["task_id"] == "house_build_0002" and task["count"]["A"] == 122
    attacks = random.Random(0)
    damage = sum(attacks.randint(1, 3) for _ in range(3))
    step = env.step(env.reset(task), ["", ""])
    # 6 x 7 x 7 = 294 positions, 122 of them air; penalty min(1, damage / 5) * 0.1.
    assert step.rewards[0] == pytest.approx(122 / 294 - min(1, damage / 5) * 0.1, rel=1e-9)
    # Budgets from the file's counts: ceil(c / 2) + c // 4.
    prompt = env.observe(task)[0]
    for block, count in [
        ("white_concrete", 68),
        ("obsidian", 12),
        ("stone_stairs", 36),
        ("stone_bricks", 54),
        ("planks", 2),
    ]:
        assert f"- {block}: {-(-count // 2) + count // 4}\n" in prompt + "\n"


def test_bad_reference_options_are_user_errors(tmp_path):
    with pytest.raises(UserError, match=r"unknown reward_mode 'ref'; valid: paper, reference"):
        make_env("minecraft", reward_mode="ref")
    for options, message in [
        ({"limited_resource": True}, "limited_resource applies to reward_mode reference only"),
        ({"reward_mode": "reference", "n_agents": 3}, "reward_mode reference takes 1 or 2 agents"),
        ({"reward_mode": "reference", "min_spiders": 1}, "set min_spiders == max_spiders"),
    ]:
        with pytest.raises(UserError, match=message):
            make_env("minecraft", **options)
