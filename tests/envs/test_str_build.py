"""Minecraft StrBuild (``make_env("str_build")``): the csv reader, the reward and the reference's rules.

Every expected reward was computed by hand from the reference's rules (OpenMLRL/LLM_Collab_Minecraft,
``str_build/utils/str_builder.py``), never by running collab. The task is the letter ``I`` (bbox x 0..4, y 0..4,
z 0; rows top-down ``#####``, ``..#..`` x 3, ``#####``): 13 target cells, 12 background cells, 12 side-by-side
pairs among the letter's cells (4 + 4 in the two bars, 4 in the stem). Agent 1 (oak_planks, stone) owns the cells
with ``x + y`` even (7), agent 2 (white_concrete, obsidian) those with ``x + y`` odd (6): two neighbours never
belong to one agent. Reward = 2 coverage - 1.5 extra / 12 - same-texture pairs / pairs - 0.25 per agent that has
not used all its blocks.
"""

from __future__ import annotations

import pytest
import torch

from collab.envs import make_env
from collab.envs.minecraft.str_rules import caps, target_colors, texture
from collab.envs.minecraft.strings import FONT, load_strings, positions, render
from collab.errors import UserError

EVEN = [(0, 4), (2, 4), (4, 4), (0, 0), (2, 0), (2, 2), (4, 0)]  # agent 1's cells; (4, 0) last
ODD = [(1, 4), (3, 4), (2, 3), (1, 0), (3, 0), (2, 1)]  # agent 2's cells


def lines(cells, block, special=None, other=None):
    return [f"/setblock {x} {y} 0 {other if (x, y) == special else block}" for x, y in cells]


A1 = lines(EVEN, "oak_planks", (2, 2), "stone")  # stone at (2, 2), oak_planks elsewhere
A2 = lines(ODD, "white_concrete", (2, 1), "obsidian")  # obsidian at (2, 1), white_concrete elsewhere
PERFECT = ["\n".join(A1), "\n".join(A2)]


def with_line(answer, index, line):
    out = list(answer)
    out[index] = line
    return "\n".join(out)


@pytest.fixture
def letter_i(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text('string,difficulty\n"I",1\n')
    return str(path)


def reward(path, actions, **options):
    env = make_env("str_build", dataset=path, **options)
    task = env.tasks("train")[0]
    return env.step(env.reset(task), list(actions))


# -- the reader ------------------------------------------------------------------------------------
def test_the_publishers_csv_format(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text('string,difficulty\n"I",1\n"",2\n"lc",x\n')
    assert load_strings(path) == [
        {"task_id": "str_build_0001", "string": "I", "difficulty": 1},  # ids count every data row
        {"task_id": "str_build_0003", "string": "lc", "difficulty": 0},  # not an integer: 0
    ]
    rows = render("lc", spacing=2)  # upper-cased; L, 2 air columns, C
    assert rows[0] == "#.......####" and rows[4] == "#####...####" and len(rows) == 5
    assert sorted(positions(render("I", 2), 0)) == sorted([(x, y, 0) for x, y in EVEN + ODD])
    env = make_env("str_build", dataset=str(path))
    assert [t["string"] for t in env.tasks("train")] == ["I"] and [t["string"] for t in env.tasks("eval")] == ["lc"]
    assert sorted(FONT) == [chr(c) for c in range(ord("A"), ord("Z") + 1)]


def test_the_shipped_strings_split_as_the_reference():
    env = make_env("str_build")
    assert len(env.tasks("train")) == 8 and len(env.tasks("eval")) == 2
    assert [r.name for r in env.roles] == ["agent1", "agent2"] and env.caps == [150, 150]
    assert env.horizon == 4 and env.num_generations == 2 and env.reward_max == 2.0


@pytest.mark.parametrize(
    "content,name,message",
    [
        (None, "none.csv", "StrBuild data file not found: .*none.csv; expected the publisher's data.csv format"),
        ("string,difficulty\nI,1\n", "data.txt", "a StrBuild dataset is a .csv file"),
        ("text,difficulty\nI,1\n", "data.csv", r"no 'string' column \(the header has: text, difficulty\)"),
        ("string,difficulty\n", "data.csv", "no row with a non-empty string"),
        ('string,difficulty\n"A1",1\n', "data.csv", "data row 1 'A1' has '1', which the 5 x 5 font does not draw"),
    ],
)
def test_a_bad_file_is_one_line(tmp_path, content, name, message):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(UserError, match=message) as e:
        make_env("str_build", dataset=str(path))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "options,message",
    [
        ({"train_split": "[5:]"}, "the train split '\\[5:\\]' of 1 StrBuild strings is empty"),
        ({"feedback": "hint"}, "feedback"),
        ({"n_agents": 3}, "n_agents 3 > 2 needs blocks"),
        ({"blocks": [["air"], ["stone"]]}, r"blocks\[0\] must name at least one block other than air"),
        ({"n_agents": 1, "blocks": [["stone"], ["obsidian"]]}, "blocks must be a list of 1 block lists"),
        ({"max_commands": 0}, "max_commands must be >= 1"),
    ],
)
def test_bad_options_are_one_line(letter_i, options, message):
    with pytest.raises(UserError, match=message) as e:
        make_env("str_build", dataset=letter_i, **options)
    assert "\n" not in str(e.value)


# -- the reward, by hand --------------------------------------------------------------------------
CASES = {
    # 13/13 covered, no extra, 0 of 12 pairs alike, every block used: 2.0
    "perfect": (PERFECT, {}, 2.0),
    # all oak_planks by agent 1: 12/12 pairs alike (-1); agent 1 lacks stone, agent 2 everything (-0.5)
    "one texture": (["\n".join(lines(EVEN + ODD, "oak_planks")), ""], {}, 2 - 1 - 0.5),
    # (0,4), (0,0) oak + (1,4) concrete: 3/13; one pair, unlike; each agent lacks a block: 6/13 - 0.5
    "partial": (
        ["/setblock 0 4 0 oak_planks\n/setblock 0 0 0 oak_planks", "/setblock 1 4 0 white_concrete"],
        {},
        6 / 13 - 0.5,
    ),
    # (1,3) is air in the letter (extra 1/12); agent 1's concrete is not its block (rejected); agent 2's
    # obsidian covers (2,3): 2/13 - 1.5/12 - 0 (one pair, stone | obsidian) - 0.5
    "wrong blocks": (
        ["/setblock 1 3 0 stone\n/setblock 2 3 0 white_concrete", "/setblock 2 3 0 obsidian"],
        {},
        2 / 13 - 1.5 / 12 - 0.5,
    ),
    "empty answers": (["", ""], {}, -0.5),  # nothing: only the palette penalty, both agents
    "one agent, empty": ([""], {"n_agents": 1}, -0.25),  # a single agent: only its own palette counts
}


@pytest.mark.parametrize("case", CASES)
def test_reward_by_hand(letter_i, case):
    actions, options, expected = CASES[case]
    assert reward(letter_i, actions, **options).rewards[0] == pytest.approx(expected)


def test_info_and_voxels(letter_i):
    step = reward(letter_i, ["\n".join(A1), "\n".join(A2) + "\n/setblock 1 3 0 obsidian\n/setblock 9 9 0 obsidian"])
    info = step.info
    assert info["iou"] == pytest.approx(13 / 14) and info["coverage"] == 1.0  # covered / (target + extra)
    assert info["extra_ratio"] == pytest.approx(1 / 12) and info["commands"] == 14 and info["rejected"] == 1
    env = make_env("str_build", dataset=letter_i)
    built, target = env.voxels(step.state)
    assert built.shape == target.shape == (5, 5, 1) and int(target.sum()) == 13 and int(built.sum()) == 14
    assert built.dtype == torch.uint8


# -- the reference's rules on hand-made inputs (quirks named) --------------------------------------
QUIRKS = {
    # coverage ignores the colour: stone and oak swapped in agent 1's cells still scores 2.0
    "any block covers": (
        ["\n".join(lines(EVEN, "stone", (2, 2), "oak_planks")), PERFECT[1]],
        {},
        2.0,
    ),
    # agent 2 writes last and may write air: (0,4) cleared: 12/13, pair (0,4)-(1,4) gone: 24/13
    "later write wins": ([PERFECT[0], PERFECT[1] + "\n/setblock 0 4 0 air"], {}, 24 / 13),
    # tokens after the block are ignored; the name is case-insensitive and the slash optional
    "extra tokens": (["\n".join(a + " replace" for a in A1), PERFECT[1].replace("/setblock", "SETBLOCK")], {}, 2.0),
    "slash then space": ([PERFECT[0].replace("/setblock", "/ setblock"), PERFECT[1]], {}, 2.0),
    # blocks: case kept (Stone refused: (2,2) empty, agent 1 lacks stone: 24/13 - 0.25); minecraft: dropped
    "Stone refused": ([with_line(A1, 5, "/setblock 2 2 0 Stone"), PERFECT[1]], {}, 24 / 13 - 0.25),
    "minecraft prefix": ([with_line(A1, 5, "/setblock 2 2 0 minecraft:stone"), PERFECT[1]], {}, 2.0),
    # coordinates are Python integers: "+2" is 2, "0_2" is 2; "~" refused (as Stone refused)
    "python integers": ([with_line(A1, 5, "/setblock +2 0_2 0 stone"), PERFECT[1]], {}, 2.0),
    "tilde refused": ([with_line(A1, 5, "/setblock ~ 2 0 stone"), PERFECT[1]], {}, 24 / 13 - 0.25),
    # the cap counts accepted commands: 12 for the team is 6 each; agent 1's 7th, (4,0), is dropped: 24/13
    "cap": (PERFECT, {"max_commands": 12}, 24 / 13),
    "rejected lines take no room": (["hello\n/kill\n" + PERFECT[0], PERFECT[1]], {"max_commands": 14}, 2.0),
    "odd cap: agent 1 takes the rest": (PERFECT, {"max_commands": 13}, 2.0),  # 7 + 6
    # the first fenced block only (its language tag dropped); list markers stripped
    "fence": (["```bash\n" + PERFECT[0] + "\n```\n/setblock 1 3 0 stone", PERFECT[1]], {}, 2.0),
    "list markers": (["\n".join(f"{i}. {a}" for i, a in enumerate(A1, 1)), "- " + "\n* ".join(A2)], {}, 2.0),
    # the palette rule counts blocks anywhere: stone moved to the extra (1,3), (2,2) oak: 2 - 1.5/12
    "palette anywhere": (
        [with_line(A1, 5, "/setblock 2 2 0 oak_planks") + "\n/setblock 1 3 0 stone", PERFECT[1]],
        {},
        2 - 1.5 / 12,
    ),
    # textures, not names: stone next to cobblestone is alike (12/12 pairs: 2 - 1); stone | oak is not
    "stone and cobblestone alike": (
        ["\n".join(lines(EVEN, "stone") + lines(ODD, "cobblestone"))],
        {"n_agents": 1, "blocks": [["stone", "cobblestone"]]},
        1.0,
    ),
    "stone and oak differ": (
        ["\n".join(lines(EVEN, "stone") + lines(ODD, "oak_planks"))],
        {"n_agents": 1, "blocks": [["stone", "oak_planks"]]},
        2.0,
    ),
}


@pytest.mark.parametrize("case", QUIRKS)
def test_reference_rules(letter_i, case):
    actions, options, expected = QUIRKS[case]
    assert reward(letter_i, actions, **options).rewards[0] == pytest.approx(expected)


def test_small_rules():
    # the reference's split: max(1, total // n) each, agent 1 also the remainder (1 for two agents is 2 + 1)
    assert caps(300, 2) == [150, 150] and caps(5, 2) == [3, 2] and caps(1, 2) == [2, 1] and caps(300, 1) == [300]
    assert [texture(b) for b in ("oak_planks", "birch_wood", "stone_bricks", "white_concrete", "obsidian")] == [
        "wood",
        "wood",
        "stone",
        "concrete",
        "obsidian",
    ]


def test_the_perfect_feedback_colouring_uses_one_block_per_agent(letter_i):
    """The reference colours agent 1's cells (x + y even: start index 0) all oak_planks and agent 2's (odd: index 1)
    all obsidian, so following its perfect feedback exactly scores 2 - 0.5: each agent leaves a block unused."""
    cells = [(x, y, 0) for x, y in EVEN + ODD]
    colours = target_colors(cells, [("oak_planks", "stone"), ("white_concrete", "obsidian")])
    assert {colours[(x, y, 0)] for x, y in EVEN} == {("oak_planks", 0)}
    assert {colours[(x, y, 0)] for x, y in ODD} == {("obsidian", 1)}
    follow = ["\n".join(lines(EVEN, "oak_planks")), "\n".join(lines(ODD, "obsidian"))]
    assert reward(letter_i, follow).rewards[0] == pytest.approx(1.5)
    env = make_env("str_build", dataset=letter_i, feedback="perfect")
    step = env.step(env.reset(env.tasks("train")[0]), [PERFECT[0], PERFECT[1] + "\n/setblock 1 3 0 obsidian"])
    one, two = (h[-1]["content"] for h in step.state.histories)
    assert "Perfect feedback, turn 2 of 4" in one and "- (2, 2, 0)" in one and "extra" not in one  # stone, not oak
    # agent 2's white_concrete cells, top row first; the extra block to the last agent only
    assert two.split("at:\n")[1].split("\n\n")[0].splitlines() == [
        "- (1, 4, 0)",
        "- (3, 4, 0)",
        "- (2, 3, 0)",
        "- (1, 0, 0)",
        "- (3, 0, 0)",
    ]
    assert two.endswith("Remove the extra blocks (set air) at:\n- (1, 3, 0)")


def test_an_episode_of_hand_written_answers(letter_i):
    """Position feedback (the reference config's), every turn scored alone on an empty bbox."""
    env = make_env("str_build", dataset=letter_i)
    state = env.reset(env.tasks("train")[0])
    first = state.histories[0]
    assert first[0]["role"] == "system" and "#####" not in first[1]["content"]  # provide_graph: false
    assert "- oak_planks\n- stone\n- air" in first[1]["content"] and "to: [4, 4, 0]" in first[1]["content"]
    shown = make_env("str_build", dataset=letter_i, show_target=True).reset(env.tasks("train")[0])
    assert "#####\n..#..\n..#..\n..#..\n#####" in shown.histories[0][1]["content"]
    rewards = []
    for actions in (PERFECT, ["", ""], ["", PERFECT[1]]):
        step = env.step(state, actions)
        rewards.append(step.rewards[0])
        state = step.state
    # turn 3: agent 2's 6 cells: 6/13, no pairs alike, agent 1 lacks both blocks: 12/13 - 0.25
    assert rewards == pytest.approx([2.0, -0.5, 12 / 13 - 0.25]) and state.turn == 3 and not state.done
    note = state.histories[1][-1]["content"]
    assert note.startswith("Position feedback, turn 4 of 4") and "(about 6)" in note and "At most 150" in note
    assert note.index("- (0, 4, 0)") < note.index("- (2, 3, 0)") < note.index("- (0, 0, 0)")  # top row first
    scored = make_env("str_build", dataset=letter_i, feedback="score")
    start = scored.reset(scored.tasks("train")[0])
    notes = scored.feedback(start, PERFECT, scored.score(start, PERFECT))
    assert (
        notes
        == [
            "Score feedback, turn 2 of 4. Coordinates are absolute (x, y, z); answer with /setblock commands only.\n"
            "Previous reward: 2.0000"
        ]
        * 2
    )


def test_prompt_tokens_count_the_listed_cells(letter_i):
    """13 letter cells (position: 120 + 130), 25 bbox cells (perfect: 80 + 250), the score line (64)."""
    assert make_env("str_build", dataset=letter_i).prompt_tokens(100, 2, [50, 40]) == 100 + 50 + 250
    assert make_env("str_build", dataset=letter_i, feedback="perfect").prompt_tokens(100, 1, [50]) == 100 + 50 + 330
    assert make_env("str_build", dataset=letter_i, feedback="score", history_window=None).prompt_tokens(
        100, 2, [50]
    ) == 100 + 2 * (50 + 64)
