"""A team of two architectures with two tokenizers: agent 0 on a tiny Qwen2 with SmolLM2's tokenizer
(49,152 tokens, ``<|im_start|>`` chat template), agent 1 on a tiny Llama with :func:`other_tokenizer` (2,048
tokens, ``### User:`` template): the same text has other ids and lengths on each side.

What crosses between the agents is text, never ids: each agent's prompt is its own chat (its history, the other
agent's responses as the environment or the Flex-MG dependency put them in) encoded with its own tokenizer, and
its response is decoded with it. The critics read text too, each in its own base's tokens: MARFT's central head
on agent 0's base, the decentralized LLM critics (IPPO) each on its agent's base (docs/models.md, "Teams of
several architectures"). Checked here by hand computations, then end to end through ``collab.fit``: a short fit
of MAGRPO, MARFT-A (central critic), IPPO (one LLM critic per base) and MAPoRL (value heads per member) whose
adapters change, with a held-out evaluation before and after; a resumed run that repeats the uninterrupted one
bitwise; and MARFT-A on 2 DDP processes (gloo) in lockstep, agreeing with 1 process.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from collab.envs.base import AgentRole, Env, Score
from collab.policy.models import BaseConfig, encode_chat
from collab.policy.team import AgentSpec, SamplingSpec
from tests.support import adapters, assert_same_tensors, fit, load, warm
from tests.support.architectures import model_dir, other_tokenizer

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> tuple[str, str]:
    """The two base folders: (Qwen2 with SmolLM2's tokenizer, Llama with the other tokenizer)."""
    root = tmp_path_factory.mktemp("bases")
    return model_dir("qwen2", root), model_dir("llama", root, tokenizer=other_tokenizer(root))


def mixed(bases: tuple[str, str], tokens: int = 6) -> list[AgentSpec]:
    return [AgentSpec(base=b, sampling=SamplingSpec(temperature=1.0, top_p=1.0, max_new_tokens=tokens)) for b in bases]


class Relay(Env):
    """Two agents write free text for two turns; each turn's feedback shows each agent the other's response, so
    a response crosses to the other tokenizer as text (and, under the chain dependency, within the turn too)."""

    name = "relay"

    def __init__(self) -> None:
        super().__init__(2)
        self.roles = (AgentRole("writer", "You write.", 6), AgentRole("editor", "You edit.", 6))

    def tasks(self, split):
        return [{"id": i} for i in range(2)]

    def observe(self, task):
        return [f"Describe item {task['id']}.", f"Edit the description of item {task['id']}."]

    def score(self, state, actions):
        return Score(((len(actions[0]) + len(actions[1])) % 3 / 2,) * 2)

    def feedback(self, state, actions, score):
        return [f"Your editor wrote: {actions[1]}", f"Your writer wrote: {actions[0]}"]


def module_for(algo: str, bases, **options):
    from collab.algos import from_config

    torch.manual_seed(0)
    module = from_config(algo, base=BaseConfig(name=bases[0], device="cpu"), agents=mixed(bases), **options)
    module.build(Relay())
    return module


# -- each agent in its own tokens ----------------------------------------------------------------------------
def test_each_agent_reads_and_writes_its_own_tokens(bases):
    """Two 2-turn episodes under the chain dependency (agent 1 sees agent 0's response of the same turn): every
    prompt is the agent's observation encoded with its own tokenizer and chat template, every id lies in its
    own vocabulary, and its completion decodes, with its own tokenizer, to the text the environment appended to
    its history; agent 1's observation holds agent 0's text. The other tokenizer would read other text."""
    module = module_for("marft_a", bases)
    team, env = module.team, module.env
    assert (
        [a.base.key for a in team.agents] == ["base0", "base1"]
        and len(team.tokenizer_of(0)) == 49152
        and len(team.tokenizer_of(1)) == 2048
    )
    episodes = module.rollout(env.tasks("train")).episodes
    assert len(episodes) == 2 and all(len(ep.steps) == 2 for ep in episodes)
    misread = 0
    for ep in episodes:
        for t, (joint, observed) in enumerate(zip(ep.completions, ep.observations)):
            for a, (c, obs) in enumerate(zip(joint, observed)):
                own, other = team.tokenizer_of(a), team.tokenizer_of(1 - a)
                assert c.agent == a and c.completion_ids
                assert c.prompt_ids == encode_chat(own, obs)
                assert max(c.prompt_ids + c.completion_ids) < len(own)
                before, after = ep.state_at(t).histories[a], ep.steps[t].state.histories[a]
                seen = after[len(before)]
                assert seen == {"role": "assistant", "content": c.text}
                assert own.decode(c.completion_ids, skip_special_tokens=True) == c.text
                misread += (
                    max(c.completion_ids) >= len(other)
                    or other.decode(c.completion_ids, skip_special_tokens=True) != c.text
                )
                header = "<|im_start|>user" if a == 0 else "### User:"
                assert header in own.decode(c.prompt_ids)
            assert f"{env.roles[0].name}: {joint[0].text.strip()}" in observed[1][-1]["content"]
            if t:  # the feedback: the other agent's previous response, now in this agent's tokens
                assert (
                    ep.state_at(t).histories[1][-1]["content"] == f"Your writer wrote: {ep.completions[t - 1][0].text}"
                )
    assert misread == 8  # every response: read with the other tokenizer, its ids are out of range or other text


def test_magrpo_tree_samples_are_in_their_agents_tokens(bases):
    """MAGRPO's rollout tree (K = 2, two turns): every sample's prompt is its agent's history at its node in its
    own tokens and template (at depth 1 the history holds the other agent's depth-0 text as feedback), and its
    response ids decode, with its own tokenizer, to the sample's text (what the environment scored)."""
    module = module_for("magrpo", bases, num_generations=2)
    team = module.team
    samples = module.rollout(module.env.tasks("train")).items
    assert {(s.member, s.turn) for s in samples} == {(0, 0), (1, 0), (0, 1), (1, 1)}
    for s in samples:
        own = team.tokenizer_of(s.member)
        assert max(s.prompt_ids + s.completion_ids) < len(own)
        assert own.decode(s.completion_ids, skip_special_tokens=True) == s.text
        prompt = own.decode(s.prompt_ids)
        assert ("<|im_start|>user" if s.member == 0 else "### User:") in prompt
        if s.turn:
            assert ("Your editor wrote: " if s.member == 0 else "Your writer wrote: ") in prompt


def test_marft_central_critic_reads_every_observation_in_its_own_base_tokens(bases):
    """MARFT-A's critic is an MLP on agent 0's frozen base: agent 1's observations are re-encoded from their
    text with agent 0's tokenizer and template (not agent 1's ids), and the cached features are the frozen
    base's last hidden state at the observation's last token, computed here row by row without adapters."""
    from collab.policy.adapters import adapters_disabled

    module = module_for("marft_a", bases)
    team = module.team
    experience = module.rollout(module.env.tasks("train"))
    critic_tokenizer, model = team.tokenizer_of(0), team.model_of(0)
    assert module.critic_model is model
    rows = module.observation_ids(experience)
    expected = [
        encode_chat(critic_tokenizer, experience.episodes[tr.episode].observations[tr.turn][i])
        for tr in experience.items
        for i in range(2)
    ]
    assert rows == expected
    assert rows[1] != list(experience.items[0].actions[1].prompt_ids)  # agent 1's own prompt is in other ids
    batch = module.prepare(experience)
    decoder = model.get_base_model().model
    with torch.no_grad(), adapters_disabled(model):
        for k, tr in enumerate(batch.items):
            for i in range(2):
                hidden = decoder(input_ids=torch.tensor([rows[2 * k + i]])).last_hidden_state[0, -1]
                assert torch.allclose(tr.features[i], hidden, rtol=1e-4, atol=1e-5 * float(hidden.abs().max()))


def test_decentralized_critics_read_their_agents_history_on_their_agents_base(bases):
    """IPPO's critic i is an adapter (and a value head) on agent i's base: the value of a state under critic 1 is
    critic 1's adapter on the Llama over agent 1's history encoded with the Llama's tokenizer, its last token's
    final hidden state through head 1, computed here by hand (with random nonzero adapters and heads)."""
    module = module_for("ippo", bases)
    team, critics = module.team, module.critics
    assert critics.keys == ["base0", "base1"] and critics.model(1) is team.model_of(1)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in [p for j in range(2) for p in critics.parameters_of(j)]:
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    state = module.env.reset(module.env.tasks("train")[1])
    with torch.no_grad():
        values = critics.state_values([state])[0]
    for j in range(2):
        model, tokenizer = critics.model(j), team.tokenizer_of(j)
        ((_, chat),) = critics.inputs(state, critic=j)
        ids = encode_chat(tokenizer, chat)
        assert ("Edit the description of item 1." if j else "Describe item 1.") in tokenizer.decode(ids)
        with torch.no_grad():
            model.set_adapter(critics.names[j])
            model.eval()
            hidden = model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0, -1]
            expected = critics.heads[j](hidden)
        assert float(values[j]) == pytest.approx(float(expected), rel=1e-4, abs=1e-6), j
        wrong = team.tokenizer_of(1 - j)  # the other agent's tokenizer gives other ids for the same chat
        assert encode_chat(wrong, chat) != ids


def test_automatic_micro_batches_are_sized_on_the_costliest_base(bases):
    """The activations probe of ``micro_batch_tokens: auto`` runs through every base and keeps the largest cost
    per token: with the small-vocabulary Llama as agent 0 it is still the Qwen's (its larger vocabulary costs
    ~10% more a token, measured: the output head runs in chunks), not the first agent's."""
    from collab.policy.team import AgentTeam
    from collab.runtime.memory import bytes_per_token

    llama, qwen = (
        bytes_per_token(AgentTeam([AgentSpec(base=b)], BaseConfig(name=b, device="cpu"))) for b in bases[::-1]
    )
    assert qwen > 1.05 * llama
    team = AgentTeam([AgentSpec(base=bases[1]), AgentSpec(base=bases[0])], BaseConfig(name=bases[1], device="cpu"))
    assert bytes_per_token(team) == pytest.approx(qwen, rel=1e-6)


def test_marft_t_refuses_a_team_of_several_bases_in_one_line(bases, tmp_path, monkeypatch, capsys):
    from collab.fit import main

    monkeypatch.chdir(tmp_path)
    argv = [
        "--algo",
        "marft_t",
        "--data.env",
        "matrix",
        "--data.env_options",
        "{}",
        "--model.base.name",
        bases[0],
        "--model.agents",
        agents_option(bases),
        "--trainer.accelerator",
        "cpu",
        "--trainer.max_steps",
        "1",
        "--trainer.logger.init_args.save_dir",
        str(tmp_path),
    ]
    assert main(argv) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "every agent must share one base" in errors[0] and "use marft_a" in errors[0]
    assert f"2 bases ({bases[0]}, {bases[1]})" in errors[0]


# -- end to end through collab.fit ------------------------------------------------------------------------------
def callbacks() -> str:
    """A checkpoint, the adapter folders, the reward summary, a seeded held-out evaluation before and after, and
    the probe of tests/support/ddp_probe.py (a reward that varies with the response where the env's own does
    not: the random models' 6-token answers score 0 at writing, math and debate)."""
    return json.dumps(
        [
            {"class_path": "collab.training.callbacks.ModelCheckpoint", "init_args": {"save_last": True}},
            {"class_path": "collab.training.callbacks.AdapterCheckpoint"},
            {"class_path": "collab.training.callbacks.RewardSummary"},
            {"class_path": "tests.support.ddp_probe.Probe"},
            {
                "class_path": "collab.training.callbacks.EvaluationCallback",
                "init_args": {
                    "at_start": True,
                    "num_samples": 2,
                    "ks": [1],
                    "seed": 0,
                    "max_tasks": 2,
                    "tasks_per_batch": 2,
                },
            },
        ]
    )


def agents_option(bases, tokens: int = 6) -> str:
    """``--model.agents`` of one agent a base, sampling from the policy itself (temperature 1, no top-p)."""
    sampling = {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": tokens}
    return json.dumps([{"base": b, "sampling": sampling} for b in bases])


# algo -> its env and options: free text where the algorithm takes it (writing, math with the Reasoner -> Actor
# chain, a 2-turn debate), the 2-turn matrix game (one-token choices, on each tokenizer) for IPPO's GAE over turns
RUNS = {
    "magrpo": ["--data.env", "writing", "--model.num_generations", "2"],
    "marft_a": ["--data.env", "math", "--data.env_options", "{dataset: addition, profile: duo}"],
    "ippo": ["--data.env", "matrix", "--data.env_options", "{}", "--data.num_turns", "2"],
    "maporl": [
        "--data.env",
        "debate",
        "--data.env_options",
        "{dataset: addition, agents: 2}",
        "--data.num_turns",
        "2",
        "--model.per_turn",
        "false",
        "--model.train_from_turn",
        "1",
    ],  # one adapter per agent, every turn trained
}


def run_args(algo: str, bases) -> list[str]:
    return [
        *RUNS[algo],
        "--model.base.name",
        bases[0],
        "--model.agents",
        agents_option(bases),
        "--data.batch_size",
        "2",
        "--trainer.callbacks",
        callbacks(),
    ]


@pytest.mark.parametrize("algo", list(RUNS))
def test_mixed_team_trains_evaluates_and_resumes(algo, bases, tmp_path, monkeypatch):
    """2 steps straight, and 1 step then ``--ckpt_path last.ckpt`` to 2: every agent's adapter moved from its
    zero start (LoRA B), the held-out evaluation ran before and after on both bases, and the resumed run ends
    bitwise where the uninterrupted one does (adapters, critics and heads, optimizer, random and task state,
    the peft folders) with the same reward at every rollout."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLLAB_DDP_PROBE", str(tmp_path))
    if algo != "ippo":  # the matrix game pays by itself
        monkeypatch.setenv("COLLAB_DDP_SIGNAL_RANKS", "0")
    args = run_args(algo, bases)
    straight = fit(tmp_path / "straight", algo, args, 2)
    part = fit(tmp_path / "parts", algo, args, 1)
    resumed = fit(tmp_path / "parts", algo, args, 2, part / "checkpoints" / "last.ckpt")

    a, r = load(straight), load(resumed)
    for i, key in enumerate(["base0", "base1"]):  # each agent on its own base, its LoRA B no longer zero
        moved = [v for k, v in a["state_dict"].items() if f"models.{key}." in k and f"lora_B.agent{i}." in k]
        assert moved and any(float(v.abs().max()) > 0 for v in moved), (algo, i)
    held_out = json.loads((straight / "reward_summary.json").read_text())["held_out"]
    assert (held_out["before_step"], held_out["after_step"]) == (0, 2)
    assert held_out["problems"] == (1 if algo == "ippo" else 2)  # the matrix game's eval split is one game

    assert (a["global_step"], r["global_step"]) == (2, 2)
    assert_same_tensors(a["state_dict"], r["state_dict"], "state_dict")
    assert_same_tensors(a["optimizer_states"], r["optimizer_states"], "optimizer")
    assert_same_tensors(a["collab"], r["collab"], "collab")
    assert_same_tensors(a["RolloutDataModule"], r["RolloutDataModule"], "task stream")
    saved = adapters(straight)
    assert_same_tensors(saved, adapters(resumed), "adapters/last")
    assert sorted(saved) == ["agent0", "agent1"]
    rewards = json.loads((straight / "reward_summary.json").read_text())["rewards"]
    assert json.loads((resumed / "reward_summary.json").read_text())["rewards"] == rewards and len(rewards) == 2


# -- two processes ------------------------------------------------------------------------------------------------
def ddp_args(bases, tmp: Path, extra: list[str]) -> list[str]:
    evaluation = {
        "class_path": "collab.training.callbacks.EvaluationCallback",
        "init_args": {
            "at_start": True,
            "at_end": False,
            "num_samples": 2,
            "ks": [1, 2],
            "seed": 7,
            "max_tasks": 3,
            "tasks_per_batch": 2,
        },
    }
    probe = [
        {"class_path": "collab.training.callbacks.ModelCheckpoint", "init_args": {"save_last": True}},
        {"class_path": "tests.support.ddp_probe.Probe"},
        evaluation,
    ]
    return [
        "--algo",
        "marft_a",
        *RUNS["marft_a"],
        "--model.base.name",
        bases[0],
        "--model.agents",
        agents_option(bases),
        "--data.batch_size",
        "4",
        "--trainer.logger.init_args.save_dir",
        str(tmp / "runs"),
        "--trainer.accelerator",
        "cpu",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.enable_model_summary",
        "false",
        "--trainer.callbacks",
        json.dumps(probe),
        *extra,
    ]


def fit_here(argv: list[str], tmp: Path, monkeypatch, **probe: str) -> int:
    from collab.fit import main

    for key, value in {"COLLAB_DDP_PROBE": str(tmp), **probe}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp)
    return main(argv)


@pytest.mark.slow
def test_mixed_team_on_two_processes_agrees_with_one(bases, tmp_path, monkeypatch):
    """MARFT-A (the central critic re-encoding agent 1's observations) on 2 gloo processes, 2 steps: the ranks
    play disjoint tasks and hold bitwise the same adapters (both bases) and critic after every step, the
    synchronised first gradient equals 1 process's on the union of both ranks' rollouts, the held-out
    evaluation before training gives the same figures on both ranks and on 1 process, and the checkpoint
    resumes on 1 process (the pattern of tests/training/test_ddp.py)."""
    probe = {"COLLAB_DDP_SIGNAL_RANKS": "0", "COLLAB_DDP_CAPTURE": "1"}
    env = warm.child_env(COLLAB_DDP_PROBE=str(tmp_path), OMP_NUM_THREADS="1", **probe)
    two = ddp_args(bases, tmp_path, ["--trainer.strategy", "ddp", "--trainer.devices", "2", "--trainer.max_steps", "2"])
    run = warm.ranks(two, tmp_path, env)  # forked warm, as Lightning's launcher starts its children
    assert run.returncode == 0, run.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["step"] == ranks[1]["step"] == 2
    assert (
        ranks[0]["digests"] == ranks[1]["digests"] and ranks[0]["start"] == ranks[1]["start"] != ranks[0]["digests"][0]
    )
    for a, b in zip(ranks[0]["tasks"], ranks[1]["tasks"]):
        assert len(a) == len(b) == 2 and not set(a) & set(b)

    ckpt = tmp_path / "runs" / "marft_a" / "version_0" / "checkpoints" / "last.ckpt"
    assert (
        fit_here(
            ddp_args(bases, tmp_path, ["--trainer.max_steps", "3", "--ckpt_path", str(ckpt)]),
            tmp_path,
            monkeypatch,
            COLLAB_DDP_CAPTURE="",
        )
        == 0
    )
    replay = tmp_path / "replay"
    replay.mkdir()
    assert (
        fit_here(
            ddp_args(bases, replay, ["--trainer.max_steps", "1"]),
            replay,
            monkeypatch,
            COLLAB_DDP_REPLAY=str(tmp_path),
            COLLAB_DDP_CAPTURE="1",
        )
        == 0
    )
    synced, union = torch.load(tmp_path / "grads0.pt"), torch.load(replay / "grads0.pt")
    assert sorted(synced) == sorted(union) and any(".base1." in n for n in union) and any("critic" in n for n in union)
    for name in union:  # float32 sums in another order and over other paddings (tests/training/test_ddp.py)
        scale = float(union[name].abs().max())
        assert float((synced[name] - union[name]).abs().max()) <= 2e-3 * scale + 1e-8, name
    assert sum(float(g.abs().sum()) for g in union.values()) > 0
    evaluations = [
        ranks[0]["evaluation"],
        ranks[1]["evaluation"],
        json.loads((replay / "rank0.json").read_text())["evaluation"],
    ]
    for e in evaluations:
        e["history"].pop("seconds")
    assert evaluations[0] == evaluations[1]
    assert evaluations[1]["scores"] == pytest.approx(evaluations[2]["scores"], rel=1e-6, abs=1e-12)
    assert len(evaluations[1]["scores"]) == 3
