"""One agent doing every role (collab.envs.centralized): CoMLRL's centralized comparator's tagged protocol against
the reference's rules, the env option ``centralized`` and its bad values, and what the wrapped env scores."""

from __future__ import annotations

import random
import re

import pytest

from collab.envs import make_env
from collab.envs.centralized import SingleModelEnv, split_tagged, tagged_prompt
from collab.errors import UserError


def reference_split(completion: str, num_agents: int) -> list[str]:
    """CoMLRL's rule (``TaggedCentralizedComparatorAdapter.parse_completion`` with the parse error that
    ``CentralizedCollaboration.split`` turns into empty outputs; centralized.py at 11d89a9, collaboration.py at
    85a6f8e), restated: for each agent index the first ``<agent_i>...</agent_i>`` section (case-insensitive, spaces
    inside the brackets, across lines), stripped, else ""; no section for any agent is a parse error, and a parse
    error scores every role as ""."""
    outputs, found = [], False
    for i in range(num_agents):
        match = re.search(rf"<\s*agent_{i}\s*>(.*?)<\s*/\s*agent_{i}\s*>", completion, re.IGNORECASE | re.DOTALL)
        found = found or match is not None
        outputs.append(match.group(1).strip() if match else "")
    if not found:
        return [""] * num_agents
    return outputs


@pytest.mark.parametrize(
    ("text", "n", "expected"),
    [
        ("<agent_0>a</agent_0>\n<agent_1>\n b \n</agent_1>", 2, ["a", "b"]),
        ("< AGENT_1 >x</ Agent_1 >", 2, ["", "x"]),  # case and spaces; agent 0 without a section
        ("no tags at all", 2, ["", ""]),
        ("<agent_0>first</agent_0> <agent_0>second</agent_0>", 1, ["first"]),  # the first section
        ("<agent_0>open, never closed <agent_1>y</agent_1>", 2, ["", "y"]),
        ("<agent_10>ten</agent_10><agent_1>one</agent_1>", 2, ["", "one"]),  # agent_1 is not agent_10's prefix
        ("<agent_1>b</agent_1><agent_0>a</agent_0>", 2, ["a", "b"]),  # out of order
        ("<agent_0>two\nlines</agent_0>", 3, ["two\nlines", "", ""]),
        ("<agent_0></agent_0>", 1, [""]),
    ],
)
def test_tagged_split_by_hand(text, n, expected):
    assert split_tagged(text, n) == expected == reference_split(text, n)


def test_tagged_split_agrees_with_the_reference_on_150_random_responses():
    """Responses made of sections with random case, spaces and newlines around the tags, sections missing, repeated,
    unclosed or out of order, indices past the team, and free text between them."""
    rng = random.Random(0)

    def tag(i: int, closing: bool) -> str:
        name = "".join(c.upper() if rng.random() < 0.3 else c for c in f"agent_{i}")
        pad = lambda: rng.choice(["", " ", "  ", "\t"])  # noqa: E731
        return f"<{pad()}{'/' + pad() if closing else ''}{name}{pad()}>"

    for case in range(150):
        n = rng.randint(1, 4)
        parts = []
        for _ in range(rng.randint(0, 6)):
            i = rng.randint(0, n + 1)
            body = rng.choice(["", "x", " 2 + 3 = 5 ", "line\nnext", "<b>", f"agent_{i}"])
            kind = rng.random()
            if kind < 0.7:
                parts.append(tag(i, False) + body + tag(i, True))
            elif kind < 0.85:
                parts.append(tag(i, False) + body)  # never closed
            else:
                parts.append(body + tag(i, True))  # a closing tag alone
            parts.append(rng.choice(["", "\n", " then ", "\n\n"]))
        text = "".join(parts)
        assert split_tagged(text, n) == reference_split(text, n), (case, text)


def test_the_tagged_prompt_holds_every_roles_instructions_and_the_sections_to_write():
    env = make_env("math", dataset="small_addition", profile="duo")
    task = env.tasks("eval")[0]
    prompt = tagged_prompt(env.roles, env.observe(task), 0)
    for i, role in enumerate(env.roles):
        assert f"Agent {i} ({role.name}):\n{role.system_prompt}" in prompt
        assert f"<agent_{i}>\n...\n</agent_{i}>" in prompt
    assert prompt.count(env.observe(task)[0]) == 2  # each role's message under its own label
    assert env.roles[0].system_prompt not in tagged_prompt(env.roles, ["feedback a", "feedback b"], 1)


def test_the_env_option_wraps_the_env_and_scores_the_graded_roles_section():
    env = make_env("math", dataset="small_addition", profile="duo", centralized="tags", num_eval=4)
    assert isinstance(env, SingleModelEnv) and env.protocol == "tags" and env.n_agents == 1 and env.name == "math"
    task = env.tasks("eval")[0]
    a, b = (int(x) for x in re.findall(r"\d+", env.inner.problem(task))[:2])
    right = f"<agent_0>{a} + {b} = {a + b}</agent_0>\n<agent_1>{a} + {b} = {a + b}</agent_1>"
    step = env.step(env.reset(task), [right])
    assert step.rewards[0] == 1.0 and step.done and step.state.memory["split"] == (f"{a} + {b} = {a + b}",) * 2
    # the Actor (agent 1) is graded: the Reasoner's right sum does not count, nor an untagged answer
    for wrong in (f"<agent_0>{a} + {b} = {a + b}</agent_0><agent_1>no idea</agent_1>", f"{a} + {b} = {a + b}"):
        assert env.step(env.reset(task), [wrong]).rewards[0] == 0.0
    headers = make_env("math", dataset="small_addition", profile="duo", centralized="headers", num_eval=4)
    assert headers.step(headers.reset(task), [f"{a} + {b} = {a + b}"]).rewards[0] == 1.0  # headers: every role's


def test_an_early_end_inside_the_wrapper_keeps_the_turns_it_skipped():
    env = make_env("math", dataset="small_addition", profile="duo", centralized="tags", num_eval=4, horizon=3)
    task = env.tasks("eval")[0]
    a, b = (int(x) for x in re.findall(r"\d+", env.inner.problem(task))[:2])
    step = env.step(env.reset(task), [f"<agent_1>{a + b}</agent_1>"])
    assert step.done and step.turns_left == 2  # solved at turn 1 of 3: the absorbing end repeats it twice


@pytest.mark.parametrize("value", ["tagged", True, 1])
def test_a_bad_protocol_is_one_line(value):
    with pytest.raises(UserError, match=r"^env option centralized must be headers \| tags .*got"):
        make_env("matrix", centralized=value)


def test_magrpo_trains_a_team_of_one_on_the_tagged_prompt():
    """``python -m collab.fit --algo magrpo --data.env_options '{centralized: tags}' --model.agents '[{}]'``: the
    module plays the wrapper with one agent, whose rollout prompts are the tagged prompt."""
    from collab.fit import build_cli
    from tests.support import quiet_fit
    from tests.training.test_cli import TINY

    argv = ["--data.env", "writing", "--data.env_options", "{centralized: tags}", "--data.batch_size", "1"]
    argv += ["--model.num_generations", "2", "--model.agents", "[{sampling: {max_new_tokens: 4}}]"]
    cli = build_cli("magrpo", [*TINY, "--trainer.logger", "false", *argv])
    module, data = cli.model, cli.datamodule
    assert isinstance(data.env, SingleModelEnv) and data.env.protocol == "tags"
    prompts, prompt = [], data.env._prompt
    data.env._prompt = lambda inner: prompts.append(prompt(inner)) or prompts[-1]
    quiet_fit(module, data, steps=1)
    assert len(module.team.specs) == 1 and module.global_step == 1
    assert prompts and all("<agent_0>\n...\n</agent_0>\n<agent_1>" in p for p in prompts)
