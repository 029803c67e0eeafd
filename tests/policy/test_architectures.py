"""Every common HF architecture through an agent team, against transformers and peft themselves.

For each family of :mod:`tests.support.architectures` (tiny random models of their own classes: fused layers,
GPT-2's ``Conv1D``, sliding windows, mixtures of experts), a team of two agents on that base, whose LoRA B
matrices are random and differ (so the agents' outputs differ), is checked at 1 and 2 torch threads:

a. greedy decoding of both agents in one batch (prompts of unequal lengths, longer than the sliding window,
   and more new tokens than the window) equals ``generate`` of the peft model with the agent's adapter set;
b. the teacher-forced log-probs of a mixed batch (a prompt shared by several rows, completions of unequal
   lengths) equal ``log_softmax`` of a plain peft forward, one row and one adapter at a time;
c. a MAGRPO step (collab's objective: group advantages and the clipped surrogate over the team's log-probs)
   moves agent 0's adapter only: agent 1's (whose advantages are 0) and the base stay bitwise the same, and
   agent 0's gradient is that of a single-agent peft model loaded from its saved adapter;
d. a saved adapter loads with plain peft (``PeftModel`` over the base, ``AutoPeftModelForCausalLM`` from the
   adapter folder alone) and gives the team's log-probs;
e. the same greedy and log-prob checks on a 4-bit (QLoRA) base, where bitsandbytes is installed.

Each family's team is built once (module-scoped fixture), and transformers' and peft's results are computed once
(at 1 thread) and compared at both thread counts. Greedy decodes are compared token for token; they may part only
at a step where transformers gives collab's token a logit within float noise (:data:`TIE`) of its best, a tie
where either token is right (in this matrix none does).
"""

from __future__ import annotations

import importlib.util
import json
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from collab.errors import UserError
from collab.objectives import clipped_surrogate, group_advantages
from collab.policy.adapters import train_adapters_only
from collab.policy.models import DEFAULT_CHAT_TEMPLATE, BaseConfig, load_tokenizer
from collab.policy.sampling import GenerationRequest
from collab.policy.team import AgentSpec, AgentTeam, LoraSpec, SamplingSpec
from tests.support.architectures import FAMILIES, MOE, SLIDING, WINDOW, model_dir

NEW_TOKENS = WINDOW + 8
"""Greedy tokens per response: past the sliding window in the decode itself (the prompts are longer too)."""
RTOL = 1e-5
"""Log-probs (about -11 here) of two code paths agree to float32 noise relative to their size."""
TIE = 1e-4
"""Logits (about 0.1-1 here) this close are a tie: two code paths may pick either token."""
LONG = (
    "Tell me a long story about a cat and a dog who go on an adventure through the forest, meet many friends "
    "along the way, cross a river, climb a hill and sing with the birds until the sun goes down."
)
MID = "Write a haiku about rain."
SHORT = "Hi"
LLAMA_LIST = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass
class Case:
    family: str
    folder: str
    team: AgentTeam
    adapters: Path
    """``adapters/agentI``: each agent's adapter as saved right after the B matrices were set."""
    prompts: dict[str, list[int]]
    refs: dict = field(default_factory=dict)
    """transformers' and peft's results, computed at the first thread count and compared at each."""


def perturb_lora_b(team: AgentTeam, seed: int = 1, std: float = 0.2) -> None:
    """Every agent's LoRA B (zero at init) random, different per agent."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for i, name in enumerate(team.names):
            for n, p in team.model_of(i).named_parameters():
                if "lora_B" in n and f".{name}." in n:
                    p.copy_(torch.randn(p.shape, generator=gen) * std)


def build_team(folder: str, **base) -> AgentTeam:
    torch.manual_seed(0)  # peft draws the LoRA A matrices from the global generator
    team = AgentTeam(
        [AgentSpec(sampling=SamplingSpec(temperature=0.0)) for _ in range(2)],
        BaseConfig(name=folder, device="cpu", **base),
    )
    perturb_lora_b(team)
    return team


def chat_prompts(team: AgentTeam) -> dict[str, list[int]]:
    """Prompts of unequal lengths; ``follow`` is a later turn of the ``long`` chat (a shared start)."""

    def user(text):
        return {"role": "user", "content": text}

    def answer(text):
        return {"role": "assistant", "content": text}

    chats = {
        "long": [user(LONG)],
        "mid": [user(MID)],
        "short": [user(SHORT)],
        "follow": [user(LONG), answer("Once upon a time, there was a dog."), user("And then?")],
    }
    return {name: team.encode(0, chat) for name, chat in chats.items()}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("architectures")


@pytest.fixture(scope="module", params=FAMILIES)
def case(request, root) -> Case:
    family = request.param
    folder = model_dir(family, root)
    team = build_team(folder)
    adapters = root / f"{family}-adapters"
    team.save_adapters(adapters)
    prompts = chat_prompts(team)
    if family in SLIDING:
        assert len(prompts["short"]) > WINDOW  # even the shortest prompt reaches past the window
    return Case(family, folder, team, adapters, prompts)


@pytest.fixture(params=[1, 2], ids=lambda n: f"{n}thread")
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@contextmanager
def adapter_set(team: AgentTeam, agent: int):
    """The agent's peft model with only its adapter active (peft's ``set_adapter``), as a user would run it."""
    model = team.model_of(agent)
    model.set_adapter(team.names[agent])
    try:
        yield model
    finally:
        train_adapters_only(model)  # set_adapter left only this adapter trainable


def forward_logprobs(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """log_softmax of one plain forward over prompt + completion, at the completion's tokens."""
    ids = torch.tensor([prompt + completion])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return logits.log_softmax(-1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


def completions(team: AgentTeam, lengths: list[int], seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    vocab = len(team.tokenizer_of(0))
    return [torch.randint(100, vocab, (n,), generator=gen).tolist() for n in lengths]


def rows(c: Case):
    """A mixed batch: agent 0 reads the long prompt three times (a shared prefix) and the middle one, agent 1 the
    long one twice and the short one; completions of unequal lengths, some past the window."""
    agents = [0, 1, 0, 1, 0, 1, 0]
    prompts = [c.prompts[k] for k in ("long", "long", "long", "short", "mid", "long", "long")]
    return agents, prompts, completions(c.team, [3, 20, 7, WINDOW + 9, 12, 5, 1])


# -- a. greedy decoding = transformers' generate ------------------------------------------------------------
def assert_same_greedy(ours: list[int], theirs: list[int], logits: list[torch.Tensor], where: str) -> None:
    for t, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:  # only a tie in transformers' own logits may part the two
            step = logits[t][0].float()
            assert step.max() - step[a] <= TIE, f"{where}: token {t} is {a}, transformers' {b} ({ours} vs {theirs})"
            return
    assert len(ours) == len(theirs), f"{where}: {ours} vs {theirs}"


def test_greedy_decoding_equals_transformers_generate(case, threads):
    check_greedy(case)


def check_greedy(case: Case) -> None:
    team = case.team
    requests = [
        GenerationRequest(a, case.prompts[k]) for a, k in ((0, "long"), (0, "follow"), (1, "long"), (1, "short"))
    ]  # agent 0's share a start
    outputs = team.generate(requests, max_new_tokens=NEW_TOKENS)
    tokenizer = team.tokenizer_of(0)
    ends = sorted({tokenizer.eos_token_id, tokenizer.pad_token_id})
    for r, out in zip(requests, outputs):
        key = ("greedy", r.agent, tuple(r.prompt_ids))
        if key not in case.refs:
            with adapter_set(team, r.agent) as model, torch.no_grad():
                ids = torch.tensor([r.prompt_ids])
                gen = model.generate(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=NEW_TOKENS,
                    do_sample=False,
                    eos_token_id=ends,
                    pad_token_id=tokenizer.pad_token_id,
                    output_logits=True,
                    return_dict_in_generate=True,
                )
            case.refs[key] = gen.sequences[0, ids.shape[1] :].tolist(), gen.logits
        assert_same_greedy(out[0].completion_ids, *case.refs[key], f"{case.family} agent {r.agent}")
    # the agents' adapters differ, and so do their responses to the same prompt
    long = tuple(case.prompts["long"])
    assert case.refs["greedy", 0, long][0] != case.refs["greedy", 1, long][0]


# -- b. teacher-forced log-probs = a plain peft forward -----------------------------------------------------
def test_logprobs_equal_a_plain_peft_forward(case, threads):
    check_logprobs(case)


def check_logprobs(case: Case) -> None:
    team = case.team
    agents, prompts, comps = rows(case)
    with torch.no_grad():
        ours = team.logprobs(agents, prompts, comps)
        base = team.logprobs(agents, prompts, comps, reference=True)  # the KL's reference: adapters off
        if "logprobs" not in case.refs:
            refs = []
            for a, p, c in zip(agents, prompts, comps):
                with adapter_set(team, a) as model:
                    refs.append(forward_logprobs(model, p, c))
            with team.model_of(0).disable_adapter():
                case.refs["logprobs"] = refs, [forward_logprobs(team.model_of(0), p, c) for p, c in zip(prompts, comps)]
            train_adapters_only(team.model_of(0))
    for lp, ref in zip(ours + base, case.refs["logprobs"][0] + case.refs["logprobs"][1]):
        torch.testing.assert_close(lp, ref, rtol=RTOL, atol=RTOL * float(ref.abs().max()))
    assert not torch.allclose(ours[0], base[0])  # the adapters change the policy


# -- c. one MAGRPO step -------------------------------------------------------------------------------------
def magrpo_loss(logprobs: list[torch.Tensor], agents: list[int], returns: dict[int, list[float]]) -> torch.Tensor:
    """collab.algos.magrpo's loss at the first update (old log-probs = the current ones): each agent's group
    advantages, each sample's clipped surrogate divided by its agent's sample count, summed."""
    seq = torch.stack([lp.sum() for lp in logprobs])
    adv = torch.zeros(len(agents))
    for a, g in returns.items():
        adv[[i for i, x in enumerate(agents) if x == a]] = group_advantages(torch.tensor(g))
    weights = torch.tensor([1.0 / agents.count(a) for a in agents])
    return (weights * clipped_surrogate(seq, seq.detach(), adv, 0.2)).sum()


def test_magrpo_step_moves_one_adapter_with_a_single_agent_peft_gradient(case, threads):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    team = case.team
    agents, prompts, comps = rows(case)
    pick = [0, 4, 1, 3]  # agent 0: long, mid; agent 1: long, short
    agents, prompts, comps = [agents[i] for i in pick], [prompts[i] for i in pick], [comps[i] for i in pick]
    returns = {0: [1.0, 0.0], 1: [1.0, 1.0]}  # agent 1's group ties: its advantages are 0
    params = {
        i: dict((n, p) for n, p in team.model_of(i).named_parameters() if "lora_" in n and f".{team.names[i]}." in n)
        for i in range(2)
    }
    saved = {i: {n: p.detach().clone() for n, p in params[i].items()} for i in range(2)}
    base = {n: t.clone() for n, t in team.model_of(0).state_dict().items() if "lora_" not in n}
    optimizer = torch.optim.AdamW([p for i in range(2) for p in params[i].values()], lr=1e-3, weight_decay=0.0)
    try:
        magrpo_loss(team.logprobs(agents, prompts, comps), agents, returns).backward()
        grads = {n.replace(".agent0.", ".default."): p.grad.clone() for n, p in params[0].items()}
        optimizer.step()
        assert any(not torch.equal(p, saved[0][n]) for n, p in params[0].items())
        assert all(torch.equal(p, saved[1][n]) for n, p in params[1].items())
        assert all(torch.equal(t, base[n]) for n, t in team.model_of(0).state_dict().items() if "lora_" not in n)
    finally:  # the other tests of this family use the adapters as they were
        with torch.no_grad():
            for i in range(2):
                for n, p in params[i].items():
                    p.copy_(saved[i][n])
                    p.grad = None

    if "gradient" not in case.refs:
        single = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(case.folder), case.adapters / "agent0", is_trainable=True
        )
        mine = [i for i, a in enumerate(agents) if a == 0]
        lps = [forward_logprobs(single, prompts[i], comps[i]) for i in mine]
        magrpo_loss(lps, [0] * len(mine), {0: returns[0]}).backward()
        case.refs["gradient"] = {n: p.grad for n, p in single.named_parameters() if p.requires_grad}
    ref = case.refs["gradient"]
    assert grads.keys() == ref.keys() and len(ref) > 0
    for n, g in grads.items():
        torch.testing.assert_close(g, ref[n], rtol=1e-4, atol=1e-4 * float(ref[n].abs().max()), msg=n)


# -- d. adapters that any tool loads ------------------------------------------------------------------------
def test_saved_adapters_load_with_plain_peft(case):
    from peft import AutoPeftModelForCausalLM, PeftModel
    from transformers import AutoModelForCausalLM

    agents, prompts, comps = rows(case)
    with torch.no_grad():
        ours = case.team.logprobs(agents, prompts, comps)
    for agent in range(2):
        folder = case.adapters / f"agent{agent}"
        config = json.loads((folder / "adapter_config.json").read_text())
        assert config["base_model_name_or_path"] == str(Path(case.folder).resolve())
        loaded = [
            PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(case.folder), folder),
            AutoPeftModelForCausalLM.from_pretrained(folder),
        ]
        for model in loaded:
            with torch.no_grad():
                for a, p, c, lp in zip(agents, prompts, comps, ours):
                    if a == agent:
                        ref = forward_logprobs(model.eval(), p, c)
                        torch.testing.assert_close(lp, ref, rtol=RTOL, atol=RTOL * float(ref.abs().max()))


# -- e. QLoRA ------------------------------------------------------------------------------------------------
@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="QLoRA needs bitsandbytes (not installed)")
@pytest.mark.parametrize("family", FAMILIES)
def test_qlora_4bit_greedy_and_logprobs(family, root, one_thread):
    team = build_team(model_dir(family, root), quantization="4bit")
    assert any("4bit" in type(m).__name__ for m in team.model_of(0).modules())
    c = Case(family, "", team, Path(), chat_prompts(team))
    check_greedy(c)
    check_logprobs(c)


# -- targets -------------------------------------------------------------------------------------------------
EXPECTED_TARGETS = {
    "phi3": "o_proj qkv_proj gate_up_proj down_proj (2 layers x 4)",
    "gpt_neox": "query_key_value dense dense_h_to_4h dense_4h_to_h (2 layers x 4)",
    "gpt2": "c_attn c_proj c_fc (2 layers x 4)",  # c_proj: the attention's output and the MLP's
    "qwen2_moe": "q_proj k_proj v_proj o_proj gate_proj up_proj down_proj (2 layers x 7); not adapted: routers "
    "mlp.gate mlp.shared_expert_gate, experts mlp.experts (3-D parameters)",  # the shared expert is
    "mixtral": "q_proj k_proj v_proj o_proj (2 layers x 4); not adapted: routers mlp.gate, experts mlp.experts "
    "(3-D parameters)",
}


def test_default_targets_are_every_linear_layer_of_the_decoder(case):
    """The start-of-run line, by hand: every attention and MLP linear layer of the family, not the head."""
    classes = {
        "gemma3_text": "Gemma3ForCausalLM",
        "gpt2": "GPT2LMHeadModel",
        "gpt_neox": "GPTNeoXForCausalLM",
        "qwen2_moe": "Qwen2MoeForCausalLM",
        "olmo2": "Olmo2ForCausalLM",
    }
    cls = classes.get(case.family, case.family.capitalize() + "ForCausalLM")
    expected = EXPECTED_TARGETS.get(case.family, " ".join(LLAMA_LIST) + " (2 layers x 7)")
    assert case.team.targets_report() == f"LoRA targets (base0, {cls}): {expected}"
    config = case.team.model_of(0).peft_config["agent0"]
    assert config.fan_in_fan_out == (case.family == "gpt2")  # Conv1D stores its weight transposed
    if case.family in MOE:  # no LoRA layer under the experts or on a router
        lora = [n for n, m in case.team.model_of(0).named_modules() if hasattr(m, "lora_A")]
        assert not [n for n in lora if ".experts" in n or n.endswith((".gate", "shared_expert_gate"))]


@pytest.mark.parametrize("name", ["tiny", "llama", pytest.param("smollm2-135m-instruct", marks=pytest.mark.slow)])
def test_default_targets_on_llama_are_the_former_list_with_the_same_init(name, root):
    """all-linear on a Llama adapts exactly the former default list, and peft initialises it the same, bit for
    bit: the defaults' numerics do not change."""
    name = model_dir(name, root) if name == "llama" else name
    teams = []
    for modules in (None, LLAMA_LIST):
        torch.manual_seed(0)
        lora = LoraSpec() if modules is None else LoraSpec(target_modules=list(modules))
        teams.append(AgentTeam([AgentSpec(lora=lora), AgentSpec(lora=lora)], BaseConfig(name=name, device="cpu")))
    new, old = ({n: p for n, p in t.models["base0"].named_parameters() if "lora_" in n} for t in teams)
    layers = teams[0].models["base0"].config.num_hidden_layers
    assert teams[0].models["base0"].peft_config["agent1"].target_modules == set(LLAMA_LIST)
    assert new.keys() == old.keys() and len(new) == 2 * layers * 7 * 2  # agents x layers x modules x (A, B)
    assert all(torch.equal(new[n], old[n]) for n in new)


def test_targets_that_match_no_layer_name_the_models_linear_layers(root):
    gpt2 = model_dir("gpt2", root)
    for modules, said in (
        (["nosuch"], "no layer 'nosuch'"),
        (LLAMA_LIST, "no layer 'q_proj'"),
        (["ln_f"], "not supported"),
    ):  # a LayerNorm: peft's own refusal
        with pytest.raises(UserError) as error:
            AgentTeam(
                [AgentSpec(), AgentSpec(lora=LoraSpec(target_modules=modules))], BaseConfig(name=gpt2, device="cpu")
            )
        message = str(error.value)
        assert "\n" not in message and message.startswith("model.agents[1].lora.target_modules: ")
        assert said in message and "GPT2LMHeadModel" in message
        assert re.search(r"c_attn c_proj c_fc( lm_head)?", message), message


# -- a tokenizer without a chat template ---------------------------------------------------------------------
def test_a_tokenizer_without_chat_template_gets_the_default_one(root):
    tokenizer = load_tokenizer(model_dir("gpt2", root))
    assert tokenizer.chat_template == DEFAULT_CHAT_TEMPLATE and tokenizer.pad_token_id == tokenizer.eos_token_id
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye"},
    ]
    text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert text == (
        f"### System:\nBe brief.\n\n### User:\nHi\n\n### Assistant:\nHello.{tokenizer.eos_token}\n\n"
        "### User:\nBye\n\n### Assistant:\n"
    )


def test_the_base_runs_without_dropout(case):
    """Lightning trains the team in train mode: the base's own dropout (GPT-2's 0.1) must stay off there, or the
    update's log-probs would be noisy where sampling's are not."""
    model = case.team.model_of(0)
    ids = torch.tensor([case.prompts["mid"]])
    with torch.no_grad():
        model.eval()
        quiet = model(input_ids=ids).logits
        model.train()
        noisy = [model(input_ids=ids).logits for _ in range(2)]
        model.eval()
    assert all(torch.equal(n, quiet) for n in noisy)
