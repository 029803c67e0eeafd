"""The classeval env: ClassEval's data file read in its publisher's format, the reference's method split, merge and
reward (OpenMLRL/LLM_Collab_Code_Completion at 1b754a3) on hand-made classes, bad input in one line, and the tests
run in the sandbox (a whole class, part of one, a syntax error, an endless loop).

The expected values are worked out by hand from the reference's code (``utils/data.py``, ``train/strategies.py``,
``utils/parse_completion.py``, ``utils/merge.py``, ``rewards/CE_reward.py``); a test named after a quirk pins a
rule of the reference that a reading of the task alone would not give."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from collab.envs import env_names, make_env
from collab.envs.classeval import data, merge
from collab.envs.classeval.reward import classeval_reward
from collab.envs.classeval.runner import TestRun, read
from collab.envs.records import packaged
from tests.envs.test_published import one_line

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"

SKELETON = '''import math

class Shape:
    """
    A shape given by its size.
    """

    def __init__(self, size):
        self.size = size

    def area(self):
        """
        :return: float, the area
        """

    def scaled(self, factor):
        """
        :param factor: float
        :return: Shape, a copy scaled by factor
        """
        pass

    def describe(self, unit, digits=2):
        """
        :return: str, the area with its unit
        """
        raise NotImplementedError()

    def done(self):
        return True'''

TEST = """import unittest

class ShapeTestArea(unittest.TestCase):
    def test_area(self):
        self.assertEqual(Shape(3).area(), 9)


class ShapeTestScaled(unittest.TestCase):
    def test_scaled(self):
        self.assertEqual(Shape(2).scaled(2).size, 4)


class ShapeTestDescribe(unittest.TestCase):
    def test_describe(self):
        self.assertEqual(Shape(1).describe('cm'), '1.00 cm')"""

RECORD = {
    "task_id": "Hand_0",
    "skeleton": SKELETON,
    "test": TEST,
    "solution_code": "",
    "import_statement": ["import math"],
    "class_description": '    """\n    A shape given by its size.\n    """\n',
    "class_name": "Shape",
    "test_classes": ["ShapeTestArea", "ShapeTestScaled", "ShapeTestDescribe"],
    "class_constructor": "class Shape: \n    def __init__(self, size):\n        self.size = size\n\n",
    "fields": ["self.size"],
    "methods_info": [],
}


def write(tmp_path: Path, records) -> str:
    path = tmp_path / "ClassEval_data.json"
    path.write_text(json.dumps(records) if not isinstance(records, str) else records)
    return str(path)


@pytest.fixture(scope="module")
def env():
    """The shipped example (Tally, TemperatureLog, WordStack), short test timers."""
    return make_env("classeval", test_timeout=0.5, workers=2)


def tally(env):
    return next(t for t in env.tasks("train") if t["class_name"] == "Tally")


RIGHT = {
    "add": "def add(self, item, times=1):\n    self.counts[item] = self.counts.get(item, 0) + times\n"
    "    return self.counts[item]",
    "count": "def count(self, item):\n    return self.counts.get(item, 0)",
    "total": "def total(self):\n    return sum(self.counts.values())",
    "reset": "def reset(self):\n    self.counts = {}",
}
"""A correct Tally: its first agent writes total and reset (one parameter each), the second add and count."""


def score(env, **changed):
    methods = {**RIGHT, **changed}
    joint = ["\n\n".join(methods[m] for m in ("total", "reset")), "\n\n".join(methods[m] for m in ("add", "count"))]
    return env.score(env.reset(tally(env)), joint)


# -- reading ClassEval's file -------------------------------------------------------------------------------
def test_the_reader_takes_the_publishers_records(tmp_path):
    other = {**RECORD, "task_id": "Hand_1"}
    path = write(tmp_path, [RECORD, other])
    for dataset in (path, f"classeval:{path}"):
        env = make_env("classeval", dataset=dataset, train_split="[:1]", eval_split="[1:]")
        task = env.tasks("train")[0]
        assert [t["task_id"] for t in env.tasks("eval")] == ["Hand_1"]
        assert task["task_id"] == "Hand_0" and task["class_name"] == "Shape" and task["test"] == TEST
        assert task["methods"] == ["area", "scaled", "describe"]  # done has a body; __init__ too
        assert task["assigned"] == (("area",), ("scaled", "describe"))
    assert len(make_env("classeval", dataset=path).tasks("train")) == 2  # the reference's [:66] of two records


def test_a_missing_or_malformed_file_is_one_line(tmp_path):
    missing = str(tmp_path / "ClassEval_data.json")
    one_line(lambda: make_env("classeval", dataset=missing), "ClassEval", "FudanSELab/ClassEval", "file not found")
    bad = {k: v for k, v in RECORD.items() if k != "test"}
    one_line(lambda: make_env("classeval", dataset=write(tmp_path, [bad])), "record 0 has no 'test'", "skeleton")
    listed = {**RECORD, "skeleton": ["class Shape:"]}
    one_line(lambda: make_env("classeval", dataset=write(tmp_path, [listed])), "record 0 (Hand_0)", "a list as")
    one_line(lambda: make_env("classeval", dataset=write(tmp_path, "[{")), "not valid JSON")
    one_line(lambda: make_env("classeval", dataset=write(tmp_path, [])), "holds no record")


def test_team_sizes_and_partitions_are_checked_in_one_line():
    one_line(lambda: make_env("classeval", agents=3), "partition params", "takes 2 agents, got 3", "round_robin")
    one_line(lambda: make_env("classeval", agents=9, partition="round_robin"), "2-8, got 9")
    one_line(lambda: make_env("classeval", partition="alternate"), "unknown classeval partition 'alternate'")
    one_line(lambda: make_env("classeval", test_timeout="soon"), "test_timeout must be a number of seconds > 0")
    env = make_env("classeval", agents=3, partition="round_robin")
    assert env.n_agents == 3 and tally(env)["assigned"] == (("add", "reset"), ("count",), ("total",))


def test_the_env_is_registered_with_its_example():
    env = make_env("classeval")
    assert "classeval" in env_names() and env.n_agents == 2 and env.reward_max == 6.0
    assert [t["task_id"] for t in env.tasks("train")] == ["example_0", "example_1"]
    assert [t["task_id"] for t in env.tasks("eval")] == ["example_2"]
    first, second = env.observe(tally(env))
    assert "class Tally:" in first and "- total\n- reset" in first and "- add" not in first
    assert "- add\n- count" in second


# -- the reference's rules, by hand --------------------------------------------------------------------------
def test_the_split_counts_every_parameter():
    """D2/D4: one parameter, ``self``, goes to agent 1; ``*args`` and keyword-only ones count; quirk: a static
    method's one parameter is not ``self`` but counts the same; a bare ``raise NotImplementedError`` (no call) and
    an ``async def`` are not methods to write."""
    skeleton = (
        "class K:\n    def a(self):\n        pass\n    def b(self, *args):\n        pass\n"
        "    def c(self, *, key):\n        '''Doc.'''\n    @staticmethod\n    def d(x):\n        pass\n"
        "    def e(self):\n        raise NotImplementedError\n    async def f(self):\n        pass\n"
    )
    assert data.methods(skeleton) == ["a", "b", "c", "d"]
    assert data.param_counts(skeleton) == {"a": 1, "b": 2, "c": 2, "d": 1, "e": 1, "f": 1}
    assert data.assign(skeleton, 2, "params") == (("a", "d"), ("b", "c"))


def test_quirk_a_class_with_a_base_list_is_passed_over():
    """D1's regex wants ``class NAME:``: the class of ``class K(Base):`` is not found, so nothing is to write."""
    assert data.class_name("class K(object):\n    def a(self):\n        pass\n") is None
    assert data.methods("class K(object):\n    def a(self):\n        pass\n") == []
    assert data.class_name("class K(object):\n    pass\nclass L:\n    pass\n") == "L"


def test_snippets_follow_the_references_cuts():
    """M1-M2: the first fenced block only; a snippet runs to the next ``def`` line at any indentation (quirk: a
    nested function cuts its method); the last of two same-named snippets wins; indentation after the first line
    is kept."""
    text = (
        "Here:\n```python\n    def a(self):\n        return 1\ndef a(self):\n    return 2\n```\n```\ndef b(): pass\n```"
    )
    assert merge.snippets(text, ["a", "b"]) == {"a": "def a(self):\n    return 2"}
    nested = "def a(self):\n    x = 1\n    def inner():\n        return x\n    return inner()"
    assert merge.snippets(nested, ["a"]) == {"a": "def a(self):\n    x = 1"}
    assert merge.snippets("```\ndef a(self):\n    return 1", ["a"]) == {"a": "def a(self):\n    return 1"}
    assert merge.snippets("```def a(self): return 1```", ["a"]) == {}


def test_quirk_a_decorator_spoils_the_snippet_before_it():
    """M2-M3: the decorator line ends the previous snippet, which then does not parse and is dropped."""
    text = "def a(self):\n    return 1\n\n@staticmethod\ndef b(x):\n    return x"
    assert merge.valid_snippets([text], [("a", "b")]) == {"b": "def b(x):\n    return x"}


def test_only_the_assigned_agent_counts_but_every_copy_overlaps():
    """M3 and R3: agent 2's ``area`` is not used (agent 1 owns it) but makes ``area`` an overlap."""
    first, second = "def area(self):\n    return 1", "def area(self):\n    return 2\ndef scaled(self, f):\n    return f"
    assert merge.valid_snippets([first, second], [("area",), ("scaled",)]) == {
        "area": "def area(self):\n    return 1",
        "scaled": "def scaled(self, f):\n    return f",
    }
    assert merge.overlaps([first, second], ["area", "scaled", "describe"]) == 1


def test_quirk_replacing_a_method_drops_the_next_ones_decorator():
    """M4-M5: a method's lines run to the next ``def`` at its indentation, so the ``@staticmethod`` above the next
    method goes with them; the snippet takes the ``def``'s indentation on every line."""
    skeleton = "class K:\n    def a(self):\n        pass\n\n    @staticmethod\n    def b(x):\n        pass"
    merged = merge.merge(skeleton, "K", {"a": "def a(self):\n    return 1"})
    assert merged == "class K:\n    def a(self):\n        return 1\n    def b(x):\n        pass\n"
    assert merge.merge(skeleton, "K", {}) == skeleton  # nothing to put in: the skeleton as written


def test_quirk_a_method_that_keeps_its_decorator_keeps_its_stub():
    """M4: the end of a decorated method's lines is looked for from the line after its first decorator, which finds
    its own ``def``: only the decorator is replaced, and the stub, defined after the snippet, is the method."""
    skeleton = "class K:\n    def a(self):\n        return 0\n\n    @staticmethod\n    def b(x):\n        pass"
    merged = merge.merge(skeleton, "K", {"b": "def b(x):\n    return x"})
    stub = "    def b(x):\n        pass"
    assert merged == f"class K:\n    def a(self):\n        return 0\n\n    def b(x):\n        return x\n{stub}\n"
    both = merge.merge(skeleton, "K", {"a": "def a(self):\n    return 1", "b": "def b(x):\n    return x"})
    assert both == "class K:\n    def a(self):\n        return 1\n    def b(x):\n        return x\n"


def test_the_reward_levels_by_hand():
    """R1-R4: 2 x 3/4 + 4 x 5/6 - 1/4; 0 when the module does not compile; no method to write: tests only."""
    total, parts = classeval_reward(valid=3, methods=4, overlap=1, compiles=True, passed=5, run=6)
    assert parts == pytest.approx({"lv1_syntax": 1.5, "lv2_tests": 10 / 3, "lv3_overlap": -0.25})
    assert total == 1.5 + 4.0 * 5 / 6 - 0.25
    assert classeval_reward(3, 4, 1, False, 0, 0)[0] == 0.0
    assert classeval_reward(0, 0, 0, True, 2, 4)[0] == 2.0
    assert classeval_reward(4, 4, 0, True, 0, 0)[0] == 2.0  # no result line: lv2 is 0


def test_no_result_line_counts_no_test():
    """T4: output other than the one JSON line (a print while the class is defined) or none at all."""
    from collab.sandbox import Result

    line = json.dumps({"run": 3, "passed": 2, "records": [["t (m.C)", "passed"], ["u (m.C)", "failed"]]})
    assert read(Result(True, 0, line, "", False, None, 0.1, False)) == TestRun(3, 2, ("u (m.C): failed",))
    assert read(Result(True, 0, "hello\n" + line, "", False, None, 0.1, False)).run == 0
    assert read(Result(False, None, "", "", True, "timeout", 9.0, False)).error == "the time limit ran out"


# -- the tests run in the sandbox ------------------------------------------------------------------------------
def test_a_correct_class_scores_six(env):
    result = score(env)
    assert result.rewards == (6.0, 6.0) and result.info["solved"] == 1.0
    assert result.info["lv3_overlap"] == 0.0 and result.memory["diagnostics"].endswith("Tests: 6/6 passed")


def test_a_partly_correct_class(env):
    """count always 0: test_count_2 fails, 5 of 6 pass: 2 + 4 x 5/6."""
    result = score(env, count="def count(self, item):\n    return 0")
    assert result.rewards[0] == 2.0 + 4.0 * 5 / 6 and result.info["pass_rate"] == 5 / 6
    assert "test_count_2 (task_module.TallyTestCount.test_count_2): failed" in result.memory["diagnostics"]


def test_a_method_with_a_syntax_error(env):
    """add does not parse: dropped (lv1 2 x 3/4), its stub returns None: only test_count_1 and test_reset pass."""
    result = score(env, add="def add(self, item, times=1)\n    return 1")
    assert result.rewards[0] == pytest.approx(1.5 + 4.0 * 2 / 6)


def test_a_class_that_does_not_compile_scores_zero(env):
    """``return`` after total parses on its own (ast) but lands in the class body: the module does not compile."""
    result = score(env, total="def total(self):\n    return 0\nreturn 1")
    assert result.rewards == (0.0, 0.0) and result.info["syntax_ok"] == 0.0 and result.info["lv1_syntax"] == 2.0
    assert "Tests: not run" in result.memory["diagnostics"]


def test_an_endless_loop_times_out_and_the_third_timeout_stops_the_run(env):
    """add never returns: test_add_1, test_add_2 and test_count_2 time out (test_count_1 passes between them), and
    the run stops there (T3): 1 passed of 4 run, test_reset and test_total not counted: 2 + 4 x 1/4."""
    result = score(env, add="def add(self, item, times=1):\n    while True:\n        pass")
    assert result.rewards[0] == 3.0 and result.info["pass_rate"] == 0.25
    assert "test_add_1 (task_module.TallyTestAdd.test_add_1): timeout" in result.memory["diagnostics"]


def test_quirk_a_print_while_the_class_is_defined_spoils_the_result(env):
    """M5 indents a snippet's trailing line into the class body, which prints when the class is defined: the
    output is no longer the result line (T4), so no test counts although all would pass."""
    result = score(env, reset="def reset(self):\n    self.counts = {}\nprint('ready')")
    assert result.rewards[0] == 2.0 and result.info["pass_rate"] == 0.0
    assert "no result (other output than the result line)" in result.memory["diagnostics"]


def test_feedback_names_each_agents_methods(env):
    state = env.reset(tally(env))
    joint = ["", "def add(self, item, times=1):\n    return 1"]
    replies = env.feedback(state, joint, env.score(state, joint))
    assert "Revise your methods (total, reset)" in replies[0] and "Revise your methods (add, count)" in replies[1]
    assert all(r.startswith("Your team's class after this turn:\n- Syntax: OK\n- Tests: ") for r in replies)


def test_every_example_solution_scores_six(env):
    """The shipped example is solvable: its own solution, split the reference's way, scores 6 on every class."""
    records = json.loads(packaged(data.EXAMPLE).read_text())
    tasks = [*env.tasks("train"), *env.tasks("eval")]
    states, joints = [], []
    for task, record in zip(tasks, records, strict=True):
        solution = {m["method_name"]: m["solution_code"] for m in record["methods_info"]}
        joints.append(["\n\n".join(solution[m] for m in mine) for mine in task["assigned"]])
        states.append(env.reset(copy.deepcopy(task)))
    assert [s.rewards[0] for s in env.score_batch(states, joints)] == [6.0, 6.0, 6.0]


@pytest.mark.skipif(not (SHARED / "ClassEval_data.json").is_file(), reason="no shared/data/ClassEval_data.json")
def test_the_published_classeval_file():
    env = make_env("classeval", dataset=f"classeval:{SHARED / 'ClassEval_data.json'}")
    train, evaluation = env.tasks("train"), env.tasks("eval")
    assert len(train) == 66 and len(evaluation) == 16 and train[0]["task_id"] == "ClassEval_0"
    assert evaluation[0]["task_id"] == "ClassEval_66" and train[0]["class_name"] == "AccessGatewayFilter"


def test_magrpo_trains_a_pair_a_step():
    from collab.fit import build_cli
    from tests.support import quiet_fit
    from tests.training.test_cli import TINY

    argv = ["--data.env", "classeval", "--data.batch_size", "1", "--data.num_turns", "2"]
    argv += ["--data.env_options", "{test_timeout: 2.0, workers: 1}", "--model.num_generations", "2"]
    argv += ["--model.agents", json.dumps([{"sampling": {"max_new_tokens": 4}}] * 2)]
    cli = build_cli("magrpo", [*TINY, "--trainer.logger", "false", *argv])
    quiet_fit(cli.model, cli.datamodule, steps=1)
    assert len(cli.model.team.specs) == 2 and cli.model.global_step == 1
