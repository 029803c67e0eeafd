"""The debate environment of MAPoRL (MAPoRL, Section 3.1): prompts, memory, datasets, grading and verifiers."""

import json
import random

import pytest
import torch

from collab.algos import data_from_config
from collab.envs import make_env
from collab.envs.debate import datasets as nli
from collab.envs.debate.env import DebateEnv, consensus
from collab.envs.debate.learned_verifier import LearnedVerifier, main
from collab.envs.debate.prompts import first_prompt, system_prompt
from collab.envs.debate.verifier import RuleVerifier
from collab.envs.debate.verifier_examples import VerifierExample, label_examples
from collab.errors import UserError

PROBLEMS = [
    {"problem": "What is 2 + 3?", "answer": "5"},
    {"problem": "What is 10 - 4?", "answer": "6"},
    {"problem": "What is 7 + 8?", "answer": "15"},
]


@pytest.fixture
def local(tmp_path):
    path = tmp_path / "toy.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROBLEMS))
    return str(path)


def toy(path, **kw):
    return make_env("debate", **{"dataset": path, "train_split": "[:2]", "eval_split": "[2:]", **kw})


def play(env, task, turns):
    """Step an episode through ``turns`` (a list of joint actions); returns every StepResult."""
    state, results = env.reset(task), []
    for joint in turns:
        result = env.step(state, joint)
        results.append(result)
        state = result.state
    return results


# -- prompts: what each agent reads at turn t+1 -----------------------------------------------------------
#
# "Answer" here is the whole response s_tj (MAPoRL concatenates the solutions, not just their final
# answers). At turn t+1 an agent's history must be exactly [its own system prompt, one user message] holding
# the question and every response of turns 1..t, and nothing else that came from the other agents.


def marked(t, j):
    return f"MARKER-t{t}-a{j} I reason carefully. \\boxed{{{t + j}}}"


def test_turn_two_prompt_holds_every_answer_and_nothing_else(local):
    env = toy(local, agents=3, horizon=3)
    task = env.tasks("train")[0]
    start = env.reset(task)
    first_messages = [h[-1]["content"] for h in start.histories]
    r1 = env.step(start, [marked(1, j) for j in range(3)])
    assert not r1.done
    for i, history in enumerate(r1.state.histories):
        # replaced, not appended: no assistant message, no turn-1 prompt, exactly [system, user]
        assert [m["role"] for m in history] == ["system", "user"]
        assert history[0]["content"] == system_prompt(i, 3) == env.roles[i].system_prompt
        prompt = history[1]["content"]
        for j in range(3):
            assert prompt.count(marked(1, j)) == 1  # every agent's whole response, once
            label = f"[Round 1, agent{j + 1}{' (you)' if j == i else ''}]\n{marked(1, j)}"
            assert label in prompt  # labelled by round and agent, the own one marked
        assert prompt.count("(you)") == 2  # the intro line and the own response's heading
        assert prompt.count(task["problem"]) == 1  # the question once
        for k in range(3):  # nothing else of the other agents: not their system prompts, not their prompts
            if k != i:
                assert system_prompt(k, 3) not in prompt
            assert first_messages[k] not in prompt
    # turn 3: the responses of turns 1 and 2, of every agent
    r2 = env.step(r1.state, [marked(2, j) for j in range(3)])
    for i, history in enumerate(r2.state.histories):
        assert [m["role"] for m in history] == ["system", "user"]
        prompt = history[1]["content"]
        assert all(prompt.count(marked(t, j)) == 1 for t in (1, 2) for j in range(3))
        assert prompt.index(marked(1, 2)) < prompt.index(marked(2, 0))  # round by round, agent by agent
    # after the last turn the final responses are appended (for logs); the episode ends at T = 3
    r3 = env.step(r2.state, [marked(3, j) for j in range(3)])
    assert r3.done
    for i, history in enumerate(r3.state.histories):
        assert history[:2] == r2.state.histories[i]
        assert history[2] == {"role": "assistant", "content": marked(3, i)}


def test_prompt_depends_on_the_responses_only(local):
    # Two debates with different responses: once every response is replaced by a placeholder, every
    # agent's prompt is the same text (up to where "(you)" sits), so no other content of any agent enters.
    env = toy(local, agents=2, horizon=2)
    task = env.tasks("train")[0]

    def templated(actions):
        prompts = [h[1]["content"] for h in env.step(env.reset(task), actions).state.histories]
        out = []
        for p in prompts:
            for j, a in enumerate(actions):
                p = p.replace(a, f"<response {j + 1}>")
            out.append(p.replace(" (you)", ""))
        return out

    a = templated(["first agent says \\boxed{5}", "second agent says 4"])
    b = templated(["Completely different words. The answer is 5.", "I refuse."])
    assert a == b and a[0] == a[1]
    assert a[0] == (
        "What is 2 + 3?\n\n"
        "These are the solutions to this problem from every agent so far, yours marked:\n\n"
        "[Round 1, agent1]\n<response 1>\n\n"
        "[Round 1, agent2]\n<response 2>\n\n"
        "Using the other agents' solutions as additional information, check their reasoning and yours, then give "
        "an updated solution. Please reason step by step, and put your final answer within \\boxed{}."
    )


def test_self_correction_with_one_agent(local):
    env = toy(local, agents=1, horizon=3)
    assert [r.name for r in env.roles] == ["agent1"]
    results = play(env, env.tasks("train")[0], [["try one: \\boxed{6}"], ["try two: \\boxed{5}"], ["final \\boxed{5}"]])
    prompt = results[1].state.histories[0][1]["content"]
    assert "[Round 1, your solution]\ntry one: \\boxed{6}" in prompt
    assert "[Round 2, your solution]\ntry two: \\boxed{5}" in prompt
    assert "agent" not in prompt.replace(system_prompt(0, 1), "")  # no other agents exist or are named
    assert results[0].rewards == (0.0,) and results[1].rewards == (1.0,)
    assert [r.info["accuracy"] for r in results] == [0.0, 1.0, 1.0]  # one voter: its own correctness


# -- scores, memory and info ------------------------------------------------------------------------------


def test_memory_and_info_over_three_turns(local):
    env = toy(local, agents=2, horizon=3)
    assert env.joint_reward is False and env.reward_max == 1.0
    task = env.tasks("train")[0]  # 2 + 3 = 5
    turns = [
        ["So \\boxed{5}", "I get \\boxed{4}"],  # R, W        -> tie: majority 0.5
        ["\\boxed{5.0} still", "no idea"],  # R, unparsable  -> only agent1 votes: 1.0
        ["The answer is 5", "\\boxed{5}"],  # R (fallback), R -> 1.0; all right, the episode still runs to T
    ]
    r1, r2, r3 = play(env, task, turns)
    assert (r1.done, r2.done, r3.done) == (False, False, True)
    assert (r1.rewards, r2.rewards, r3.rewards) == ((1.0, 0.0), (1.0, 0.0), (1.0, 1.0))
    memory = r3.state.memory
    assert memory["answers"] == (("5", "4"), ("5", None), ("5", "5"))  # 5.0 normalised to 5
    assert memory["correct"] == ((True, False), (True, False), (True, True))
    assert memory["scores"] == ((1.0, 0.0), (1.0, 0.0), (1.0, 1.0))
    assert memory["majority"] == (0.5, 1.0, 1.0)
    assert memory["responses"][1] == tuple(turns[1])
    assert r1.info == {"majority@1": 0.5, "accuracy": 0.5, "agent_accuracy": 0.5, "answered": 1.0}
    assert r2.info == {"majority@1": 0.5, "majority@2": 1.0, "accuracy": 1.0, "agent_accuracy": 0.5, "answered": 0.5}
    assert r3.info == {
        "majority@1": 0.5,
        "majority@2": 1.0,
        "majority@3": 1.0,
        "accuracy": 1.0,
        "agent_accuracy": 1.0,
        "answered": 1.0,
    }
    # the earlier turns' memory is kept in each state (states are immutable values)
    assert r1.state.memory["answers"] == (("5", "4"),)


# -- early stop on consensus -------------------------------------------------------------------------------


def test_consensus_rule():
    """A parsed answer given by at least ``share`` of all agents (unparsable ones count, agree with nobody); with
    ``min_score`` the agreeing agents' mean score must be above it (the reference code's 0.7)."""
    assert consensus(["5", "5"]) == "5"
    assert consensus(["5", "4"]) is None and consensus(["5", None]) is None and consensus([None, None]) is None
    assert consensus(["5", "5", "4"]) is None
    assert consensus(["5", "5", "4"], share=2 / 3) == "5" and consensus(["5", "5", None], share=2 / 3) == "5"
    assert consensus(["5", "4", None], share=0.6) is None
    assert consensus(["5"]) == "5"  # one agent (self-correction): any parsed answer
    assert consensus(["5", "5"], [1.0, 1.0], min_score=0.7) == "5"
    assert consensus(["4", "4"], [0.0, 0.0], min_score=0.7) is None  # a wrong agreement, rule verifier
    assert consensus(["5", "5"], [0.7, 0.7], min_score=0.7) is None  # above, not at
    assert consensus(["5", "5", "4"], [0.8, 0.7, 0.0], share=2 / 3, min_score=0.7) == "5"  # mean of the two: 0.75
    with pytest.raises(ValueError):
        consensus(["5", "5"], share=0.5)


def test_consensus_ends_the_debate_as_an_absorbing_state(local):
    """T = 3, consensus at turn 2: the episode ends with turns_left 1; majority@3 and the votes repeat turn 2."""
    env = toy(local, agents=2, horizon=3, stop_on_consensus=True)
    task = env.tasks("train")[0]  # 5
    r1, r2 = play(env, task, [["\\boxed{5}", "\\boxed{4}"], ["\\boxed{4}", "so \\boxed{4}"]])
    assert (r1.done, r1.turns_left) == (False, 0)
    assert (r2.done, r2.turns_left) == (True, 1)
    assert r2.rewards == (0.0, 0.0)  # a wrong consensus also ends it (no consensus_score)
    assert r2.state.memory["consensus"] == (None, "4")
    assert r1.info["consensus"] == 0.0 and r2.info["consensus"] == 1.0
    assert r2.info == {
        "majority@1": 0.5,
        "majority@2": 0.0,
        "majority@3": 0.0,
        "accuracy": 0.0,
        "agent_accuracy": 0.0,
        "answered": 1.0,
        "consensus": 1.0,
    }
    assert len(r2.state.memory["answers"]) == 2  # memory holds the played turns only
    answers, correct = env.votes(r2.state)
    assert answers == (("5", "4"), ("4", "4"), ("4", "4")) and correct == (
        (True, False),
        (False, False),
        (False, False),
    )
    assert r2.state.histories[0][-1] == {"role": "assistant", "content": "\\boxed{4}"}  # final answer appended

    # consensus at the last turn: done anyway, nothing skipped; the option off: all T turns
    r = play(env, task, [["\\boxed{5}", "\\boxed{4}"], ["\\boxed{5}", "x"], ["\\boxed{5}", "\\boxed{5}"]])
    assert [x.done for x in r] == [False, False, True] and r[-1].turns_left == 0 and len(env.votes(r[-1].state)[0]) == 3
    off = play(toy(local, agents=2, horizon=3), task, [["\\boxed{5}", "\\boxed{5}"]] * 3)
    assert [x.done for x in off] == [False, False, True] and "consensus" not in off[0].info


def test_consensus_score_stops_only_on_a_verified_agreement(local):
    """The reference's rule (consensus_score 0.7, rule verifier): a wrong agreement goes on, a right one stops."""
    env = toy(local, agents=2, horizon=3, stop_on_consensus=True, consensus_score=0.7)
    task = env.tasks("train")[0]
    r1, r2 = play(env, task, [["\\boxed{4}", "\\boxed{4}"], ["\\boxed{5}", "\\boxed{5}"]])
    assert not r1.done and r2.done and r2.turns_left == 1
    with pytest.raises(UserError, match="consensus_share"):
        toy(local, consensus_share=0.5)
    with pytest.raises(UserError, match="consensus_score"):
        toy(local, consensus_score=1.0)


def test_grade_answers(local):
    env = toy(local)
    task = env.tasks("train")[0]
    assert env.grade_answers(
        task, ["\\boxed{5}", "\\boxed{6}", "so the answer is 5.", "", "\\boxed{\\frac{10}{2}}"]
    ) == [("5", True), ("6", False), ("5", True), (None, False), ("5", True)]
    strict = toy(local, fallback=False)
    assert strict.grade_answers(task, ["so the answer is 5."]) == [(None, False)]


def test_score_batch_matches_score(local):
    env = toy(local, agents=2)
    states = [env.reset(t) for t in env.tasks("train")]
    actions = [["\\boxed{5}", "\\boxed{1}"], ["\\boxed{6}", "\\boxed{6}"]]
    batch = env.score_batch(states, actions)
    assert [s.rewards for s in batch] == [(1.0, 0.0), (1.0, 1.0)]
    assert batch == [env.score(s, a) for s, a in zip(states, actions)]


def test_default_dataset_has_a_fixed_eval_split():
    env = make_env("debate")
    assert isinstance(env, DebateEnv) and env.dataset == "addition" and env.n_agents == 2 and env.horizon == 2
    evals = env.tasks("eval")
    assert len(evals) >= 50
    assert [t["problem"] for t in make_env("debate", seed=5).tasks("eval")] == [t["problem"] for t in evals]
    assert not {t["problem"] for t in evals} & {t["problem"] for t in env.tasks("train")}
    assert env.observe(evals[0]) == [first_prompt(evals[0])] * 2
    assert "\\boxed{}" in first_prompt(evals[0])


def test_bad_names_are_one_line_user_errors(local):
    with pytest.raises(UserError) as e:
        make_env("debate", dataset="nope")
    message = str(e.value)
    assert "\n" not in message and "'nope'" in message
    for name in ("addition", "gsm_symbolic", "gsm8k", "cb", "rte", "anli:PATH"):
        assert name in message
    with pytest.raises(UserError, match="at least 1 agent"):
        make_env("debate", agents=0)
    with pytest.raises(UserError, match="unknown split"):
        make_env("debate").tasks("test")
    with pytest.raises(UserError, match="bad split"):
        make_env("debate", dataset=local, train_split="[a:b]")
    with pytest.raises(UserError, match="unknown verifier"):
        make_env("debate", verifier="oracle")
    with pytest.raises(UserError, match="ANLI"):
        make_env("debate", dataset="anli:missing")


# -- NLI ---------------------------------------------------------------------------------------------------


def test_cb_loads_56_three_way_examples():
    records = nli.load_cb()
    assert len(records) == 56
    counts = {label: sum(r["answer"] == label for r in records) for label in nli.NLI_LABELS}
    assert counts == {"entailment": 23, "neutral": 5, "contradiction": 28}  # SuperGLUE CB validation
    assert records[0]["labels"] == nli.NLI_LABELS and records[0]["id"] == "cb/0"
    assert records[0]["problem"] == f"Premise: {records[0]['premise']}\nHypothesis: {records[0]['hypothesis']}"
    env = make_env("debate", dataset="cb")
    assert len(env.tasks("eval")) == 56  # every CB example is eval by default ...
    with pytest.raises(UserError, match="train_split") as e:  # ... so train needs an explicit split
        env.tasks("train")
    assert "\n" not in str(e.value)
    split = make_env("debate", dataset="cb", train_split="[:16]")
    assert len(split.tasks("train")) == 16 and len(split.tasks("eval")) == 40
    prompt = split.observe(split.tasks("eval")[0])[0]
    assert "entailment, neutral or contradiction" in prompt and "\\boxed{}" in prompt


def test_rte_is_two_way():
    records = nli.load_rte()
    assert len(records) == 277
    assert {r["answer"] for r in records} == {"entailment", "not entailment"}
    env = make_env("debate", dataset="rte")
    evals, train = env.tasks("eval"), env.tasks("train")
    assert len(evals) == 64 and len(train) == 213 and not {r["id"] for r in evals} & {r["id"] for r in train}
    assert [r["id"] for r in make_env("debate", dataset="rte").tasks("eval")] == [r["id"] for r in evals]
    task = next(r for r in evals if r["answer"] == "not entailment")
    assert env.grade_answers(task, ["\\boxed{contradiction}", "\\boxed{not_entailment}", "\\boxed{entailment}"]) == [
        ("not entailment", True),
        ("not entailment", True),
        ("entailment", False),
    ]


def test_anli_from_a_local_file(tmp_path):
    rows = [
        {"uid": "a1", "premise": "A dog runs.", "hypothesis": "An animal moves.", "label": 0},
        {"uid": "a2", "context": "It rains.", "hypothesis": "The sun is out.", "label": "c"},  # original ANLI keys
        {"uid": "a3", "premise": "Tom sings.", "hypothesis": "Tom is tall.", "label": "n"},
        {"uid": "a4", "premise": "x", "hypothesis": "y", "label": -1},  # unlabelled: skipped
    ]
    path = tmp_path / "anli.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = make_env("debate", dataset=f"anli:{path}", train_split="[:2]", eval_split="[2:]")
    assert [(r["id"], r["answer"]) for r in env.tasks("train")] == [
        ("anli/a1", "entailment"),
        ("anli/a2", "contradiction"),
    ]
    assert [r["answer"] for r in env.tasks("eval")] == ["neutral"]
    path.write_text(json.dumps({"uid": "b", "premise": "p", "label": 1}) + "\n")
    with pytest.raises(UserError, match="no 'hypothesis' field"):
        make_env("debate", dataset=f"anli:{path}").tasks("eval")


@pytest.mark.parametrize(
    "text,expected",
    [
        ("The premise says so. \\boxed{Entailment}", "entailment"),
        ("Not entailment, it is neutral.\n\\boxed{contradiction}", "contradiction"),
        ("Reasoning...\nFinal answer: NEUTRAL", "neutral"),  # the last line
        ("I first thought entailment.\nThe hypothesis contradicts the premise.", "contradiction"),  # last line wins
        ("Contradiction is wrong here; the answer is neutral.\nDone.", "neutral"),  # fallback: last label in the text
        ("\\boxed{maybe}", None),  # a box without a label
        ("No label here.", None),
        ("\\boxed{not entailment}", None),  # names no single label of 3-way NLI
    ],
)
def test_extract_label(text, expected):
    assert nli.extract_label(text) == expected


def test_extract_label_two_way_and_no_fallback():
    assert nli.extract_label("\\boxed{neutral}", nli.RTE_LABELS) == "not entailment"
    assert nli.extract_label("It is non-entailment", nli.RTE_LABELS) == "not entailment"
    assert nli.extract_label("entailment", nli.RTE_LABELS) == "entailment"
    assert nli.extract_label("Label: neutral.\nThanks!", fallback=False) is None
    assert nli.extract_label("Label: neutral.\nThanks!", fallback=True) == "neutral"


# -- verifiers ---------------------------------------------------------------------------------------------


def test_rule_verifier(local):
    env = toy(local)
    tasks = env.tasks("train")
    assert RuleVerifier().score(tasks, ["\\boxed{5}", "\\boxed{7}"]) == [1.0, 0.0]
    examples = label_examples(env, tasks[:1], [["\\boxed{5}", "\\boxed{3}"]])
    assert examples == [
        VerifierExample("What is 2 + 3?", "\\boxed{5}", True),
        VerifierExample("What is 2 + 3?", "\\boxed{3}", False),
    ]


SEPARABLE = [  # (question, answer text, correct): right answers end in the right number
    ("What is 2 + 3?", "2 + 3 = 5, so the answer is \\boxed{5}.", True),
    ("What is 2 + 3?", "2 + 3 = 6, so the answer is \\boxed{6}.", False),
    ("What is 4 + 4?", "Four and four make \\boxed{8}.", True),
    ("What is 4 + 4?", "Four and four make \\boxed{44}.", False),
    ("What is 9 - 3?", "Nine minus three is \\boxed{6}.", True),
    ("What is 9 - 3?", "Nine minus three is \\boxed{12}.", False),
    ("What is 1 + 1?", "One plus one: \\boxed{2}.", True),
    ("What is 1 + 1?", "One plus one: \\boxed{11}.", False),
]


@pytest.fixture
def tiny_verifier(tiny_tokenizer):
    from collab.policy.models import tiny_llama

    torch.manual_seed(0)
    model = tiny_llama(len(tiny_tokenizer), seed=0).eval().requires_grad_(False)
    return LearnedVerifier(model, tiny_tokenizer, base="tiny", widths=(64,), seed=0)


def test_learned_verifier_fits_and_roundtrips(tiny_verifier, tiny_tokenizer, tmp_path, local):
    random.seed(0)
    questions, answers, labels = zip(*SEPARABLE)
    before = tiny_verifier.score(list(questions), list(answers))
    assert before == pytest.approx([0.5] * 8)  # the head's output layer starts at zero: sigmoid(0)
    losses = tiny_verifier.fit(SEPARABLE, epochs=150, lr=1e-2, batch_size=4, seed=0)
    assert losses[-1] < 0.1 * losses[0]
    after = tiny_verifier.score(list(questions), list(answers))
    assert all((p > 0.5) == y for p, y in zip(after, labels))  # training accuracy 1.0
    assert all(abs(p - y) < abs(b - y) for p, b, y in zip(after, before, labels))  # every score moved toward its label

    folder = tmp_path / "verifier"
    tiny_verifier.save(folder)
    same_model = LearnedVerifier.load(folder, model=tiny_verifier.model, tokenizer=tiny_tokenizer)
    assert same_model.score(list(questions), list(answers)) == pytest.approx(after, rel=1e-5)
    rebuilt = LearnedVerifier.load(folder, device="cpu")  # the base rebuilt from its saved name ("tiny", seed 0)
    assert rebuilt.score(list(questions), list(answers)) == pytest.approx(after, rel=1e-4)

    # the env's rewards are the learned verifier's scores; memory["correct"] stays the rule verdict
    env = data_from_config(
        "magrpo",
        env="debate",
        env_options={
            "dataset": local,
            "train_split": "[:2]",
            "eval_split": "[2:]",
            "verifier": str(folder),
            "verifier_device": "cpu",
        },
    ).env
    task = env.tasks("train")[0]  # What is 2 + 3?
    result = env.step(env.reset(task), [SEPARABLE[0][1], SEPARABLE[1][1]])
    expected = rebuilt.score([task, task], [SEPARABLE[0][1], SEPARABLE[1][1]])
    assert result.rewards == pytest.approx(tuple(expected), rel=1e-4)
    assert result.state.memory["correct"] == ((True, False),)
    assert result.state.memory["scores"][0] == pytest.approx(tuple(expected), rel=1e-4)


def test_learned_verifier_load_errors(tmp_path, tiny_verifier):
    with pytest.raises(UserError, match="not a learned verifier folder"):
        LearnedVerifier.load(tmp_path)
    with pytest.raises(UserError, match="at least one labelled example"):
        tiny_verifier.fit([])


def test_verifier_command_line(tmp_path, tiny_tokenizer):
    # Real end to end on the tiny model: sample answers to 2 problems, label them by rule, train, save.
    out = tmp_path / "head"
    summary = main(
        [
            "--dataset",
            "addition",
            "--model",
            "tiny",
            "--out",
            str(out),
            "--problems",
            "2",
            "--samples",
            "2",
            "--max-new-tokens",
            "4",
            "--epochs",
            "3",
            "--device",
            "cpu",
        ]
    )
    assert summary["examples"] == 4.0
    assert (out / "verifier.json").is_file() and (out / "head.pt").is_file()
    assert json.loads((out / "verifier.json").read_text())["base"] == "tiny"
