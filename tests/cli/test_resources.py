"""More processes than the machine holds end before any is started, in one line:
:mod:`collab.cli.resources` on hand-made machines, and the CLI on this one."""

import os

import pytest

from collab.cli.resources import (
    GB,
    KNOWN_PARAMS,
    OVERHEAD_BYTES,
    Launch,
    Machine,
    base_bytes_per_param,
    base_parameters,
    check_fits,
    process_bytes,
    team_process_bytes,
)
from collab.errors import UserError


def test_a_process_holds_its_base_its_adapters_and_the_overhead():
    assert process_bytes(0, 4, 2) == OVERHEAD_BYTES
    # 1.7B parameters in bfloat16, 2 agents: 3.4e9 weights + 2 x 2% x 1.7e9 x 16 bytes (adapter, grad, 2 moments)
    assert process_bytes(1_700_000_000, 2, 2, overhead=0) == 3_400_000_000 + 1_088_000_000
    assert base_bytes_per_param("bfloat16", "none") == 2 and base_bytes_per_param("float32", "none") == 4
    assert base_bytes_per_param("bfloat16", "4bit") < 1 and base_bytes_per_param("float32", "8bit") == 1
    assert base_parameters("no/such-model-here") is None


def test_a_mixed_team_process_holds_every_base_once_with_its_own_agents():
    """Each process of a two-base team loads both bases: their weights and their agents' adapters add up, with one
    overhead (the estimate of the default base alone would be short by a whole model)."""
    from collab.policy.models import BaseConfig

    base = BaseConfig(name="smollm2-135m-instruct", dtype="bfloat16")
    small, tiny = KNOWN_PARAMS["smollm2-135m-instruct"], KNOWN_PARAMS["tiny"]
    assert team_process_bytes(base, 2) == process_bytes(small, 2, 2)
    assert team_process_bytes(base, [None, None]) == process_bytes(small, 2, 2)
    mixed = team_process_bytes(base, [None, "tiny", "tiny"])
    assert mixed == OVERHEAD_BYTES + process_bytes(small, 2, 1, overhead=0) + process_bytes(tiny, 2, 2, overhead=0)
    assert team_process_bytes(base, [None, "no/such-model-here"]) is None  # a size not at hand: not checked


def test_a_process_holds_each_full_agent_whole():
    """A full-parameter agent adds its weights, gradients and AdamW's two moments to every process: 4 x 2 bytes a
    parameter in bfloat16, beside the LoRA agents' shared base; a team of full agents alone loads no shared base."""
    from collab.policy.models import BaseConfig

    base = BaseConfig(name="smollm2-135m-instruct", dtype="bfloat16")
    small = KNOWN_PARAMS["smollm2-135m-instruct"]
    assert team_process_bytes(base, [None], [None]) == process_bytes(small, 2, 1) + 8 * small
    assert team_process_bytes(base, [], [None, None]) == OVERHEAD_BYTES + 2 * 8 * small
    assert team_process_bytes(base, [], ["no/such-model-here"]) is None


@pytest.mark.parametrize("name", sorted(KNOWN_PARAMS))
def test_the_built_in_bases_counts_are_their_models(name):
    """KNOWN_PARAMS (counted without loading, before the processes start) against the models themselves."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from collab.policy.models import TINY, load_tokenizer, model_folder, tiny_llama

    with torch.device("meta"):
        model = (
            tiny_llama(len(load_tokenizer(TINY)))
            if name == TINY
            else AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_folder(name)))
        )
    assert base_parameters(name) == sum(p.numel() for p in model.parameters()) > 0


def test_what_fits_passes():
    check_fits(Launch(2, "cpu", GB), Machine(cores=2, memory_available=4 * GB))
    check_fits(Launch(8, "gpu", 2 * GB), Machine(cores=4, memory_available=64 * GB, gpus=8))  # GPUs: not one core each
    check_fits(Launch(1, "cpu", 100 * GB), Machine(cores=1, memory_available=GB))  # one process: nothing to launch
    check_fits(Launch(4, "cpu", None), Machine(cores=4, memory_available=None))  # unknown base: cores only


def test_too_many_cpu_processes_say_cores_memory_and_what_fits():
    with pytest.raises(UserError) as e:
        check_fits(Launch(64, "cpu", GB), Machine(cores=2, memory_available=16 * GB))
    line = str(e.value)
    assert "\n" not in line and "--trainer.devices 64" in line and "2 CPU cores" in line
    assert "1.0 GB per process" in line and "16.0 GB of memory available" in line and "at most 2 fit" in line


def test_memory_alone_can_refuse():
    with pytest.raises(
        UserError, match=r"10.0 GB of memory available, about 3.0 GB per process \(12.0 GB for 4\): at most 3 fit"
    ):
        check_fits(Launch(4, "cpu", 3 * GB), Machine(cores=16, memory_available=10 * GB))


def test_more_gpu_processes_than_gpus():
    with pytest.raises(UserError, match=r"2 CUDA devices.*at most 2 fit here \(--trainer.devices 2\)"):
        check_fits(Launch(4, "gpu", GB), Machine(cores=32, memory_available=64 * GB, gpus=2))


def test_the_cli_refuses_64_cpu_processes_before_starting_any(tmp_path, monkeypatch, capsys):
    if len(os.sched_getaffinity(0)) >= 64:
        pytest.skip("this machine holds 64 CPU processes")
    from collab.fit import main

    monkeypatch.chdir(tmp_path)
    code = main(
        [
            "--algo",
            "magrpo",
            "--data.env",
            "matrix",
            "--model.base.name",
            "tiny",
            "--trainer.devices",
            "64",
            "--trainer.strategy",
            "ddp",
            "--trainer.accelerator",
            "cpu",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len([line for line in err if line.startswith("error:")]) == 1, err
    line = next(line for line in err if line.startswith("error:"))
    assert "--trainer.devices 64" in line and "CPU core" in line and "GB per process" in line and "fit here" in line
    assert not (tmp_path / "runs").exists()  # nothing started


def test_the_launch_counts_the_team_the_environment_makes(monkeypatch):
    """A config of a LoRA and a full agent on 4 players: the two more repeat the full one (collab.algos.agents),
    and every process holds three full agents, which the check before the launch counts."""
    from types import SimpleNamespace

    from collab.algos import from_config
    from collab.cli import resources
    from collab.envs import make_env
    from collab.policy.models import BaseConfig
    from collab.policy.team import AgentSpec

    seen = {}
    monkeypatch.setattr(resources, "check_launch", lambda trainer, base, lora, full: seen.update(lora=lora, full=full))
    module = from_config("magrpo", base=BaseConfig(name="tiny"), agents=[AgentSpec(), AgentSpec(finetune="full")])
    trainer = SimpleNamespace(strategy=object(), callbacks=[])
    resources.prepare_processes(trainer, module, 60.0, make_env("matrix", players=4))
    assert seen == {"lora": [None], "full": [None, None, None]}
    resources.prepare_processes(trainer, module, 60.0)  # no environment at hand: the configured agents
    assert seen == {"lora": [None], "full": [None]}
