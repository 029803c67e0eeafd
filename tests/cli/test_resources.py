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


def test_under_fsdp_a_process_holds_a_share_of_each_model_and_the_backwards_whole_ones():
    """Two full agents of SmolLM2-135M (s parameters) in bfloat16: 16 s a process under ddp. Under fsdp over 2
    processes each keeps half of both (8 s) and a backward pass gathers one agent's weights and gradients whole
    (4 s): 12 s; over 4, 4 s + 4 s. An algorithm whose passes use every model (MAPoRL) gathers both: 8 s + 8 s over
    2, as much as ddp. A LoRA agent's shared base: its share and the whole base gathered."""
    from collab.policy.models import BaseConfig

    base = BaseConfig(name="smollm2-135m-instruct", dtype="bfloat16")
    small = KNOWN_PARAMS["smollm2-135m-instruct"]
    assert team_process_bytes(base, [], [None, None]) == OVERHEAD_BYTES + 16 * small
    assert team_process_bytes(base, [], [None, None], shards=2) == OVERHEAD_BYTES + 8 * small + 4 * small
    assert team_process_bytes(base, [], [None, None], shards=4) == OVERHEAD_BYTES + 4 * small + 4 * small
    every = team_process_bytes(base, [], [None, None], shards=2, per_model=False)
    assert every == OVERHEAD_BYTES + 8 * small + 8 * small
    adapters = process_bytes(small, 0, 1, overhead=0)
    assert team_process_bytes(base, [None], [], shards=2) == OVERHEAD_BYTES + adapters + small + 2 * small


@pytest.mark.parametrize("name", sorted(KNOWN_PARAMS))
def test_the_built_in_bases_counts_are_their_models(name):
    """KNOWN_PARAMS and the shapes of KNOWN_CONFIGS (counted without loading, before the processes start) against the
    models themselves."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from collab.policy.models import TINY, base_config, load_tokenizer, model_folder, tiny_llama
    from collab.runtime.projection import shape_from_config

    with torch.device("meta"):
        model = (
            tiny_llama(len(load_tokenizer(TINY)))
            if name == TINY
            else AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_folder(name)))
        )
    assert base_parameters(name) == sum(p.numel() for p in model.parameters()) > 0
    assert shape_from_config(base_config(name)) == shape_from_config(model.config.to_dict())


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
    monkeypatch.setattr(
        resources, "check_launch", lambda trainer, base, lora, full, per_model: seen.update(lora=lora, full=full)
    )
    module = from_config("magrpo", base=BaseConfig(name="tiny"), agents=[AgentSpec(), AgentSpec(finetune="full")])
    trainer = SimpleNamespace(strategy=object(), callbacks=[])
    resources.prepare_processes(trainer, module, 60.0, make_env("matrix", players=4))
    assert seen == {"lora": [None], "full": [None, None, None]}
    resources.prepare_processes(trainer, module, 60.0)  # no environment at hand: the configured agents
    assert seen == {"lora": [None], "full": [None]}


# -- the team, counted before loading (check_team) ---------------------------------------------------------------
CPU = type("CPUAccelerator", (), {})
"""Lightning's CPU accelerator as check_team reads it: by its class's name."""


def _trainer(processes: int = 1):
    from types import SimpleNamespace

    return SimpleNamespace(
        accelerator=CPU(), num_devices=processes, world_size=processes, strategy=object(), callbacks=[]
    )


def _module(**options):
    """MAGRPO on tiny, K = 2, 16 new tokens an agent, budgets of 0.25 GiB: a step whose counts do not depend on the
    machine's RAM (the default budgets are a share of it)."""
    from collab.algos import from_config
    from collab.policy.models import BaseConfig
    from collab.policy.team import AgentSpec, SamplingSpec

    options = {
        "base": BaseConfig(name="tiny"),
        "agents": [AgentSpec(sampling=SamplingSpec(max_new_tokens=16))],
        "num_generations": 2,
        "decode_memory_gb": 0.25,
        "micro_batch_memory_gb": 0.25,
        **options,
    }
    return from_config("magrpo", **options)


def _machine(gib: float) -> Machine:
    return Machine(cores=16, memory_available=int(gib * GB))


def test_a_team_that_cannot_fit_is_refused_saying_what_would(monkeypatch):
    """Six debaters against 0.9 GiB (faked): the line gives the projection, the memory available and the most
    agents that fit, which a scan of the team's projections for 1, 2, ... agents confirms."""
    import torch

    from collab.cli import resources
    from collab.envs import make_env

    monkeypatch.setattr(resources, "this_machine", lambda: _machine(0.9))
    module, env = _module(), make_env("debate", agents=6)
    with pytest.raises(UserError) as e:
        resources.check_team(_trainer(), module, env, 2)
    line = str(e.value)
    project = resources.plan_team(module, env, 2, torch.device("cpu"))
    total = project(6)[0].total
    fits = max(m for m in range(1, 6) if project(m)[0].total <= 0.9 * GB)
    assert "\n" not in line and line.startswith("the team does not fit this machine: 6 agents project ")
    assert f"{total / GB:.2f} GiB against 0.90 GiB of memory available" in line and total > 0.9 * GB
    assert f"at most {fits} agent{'s' if fits > 1 else ''} fit here" in line and 1 <= fits < 6
    assert "fixed 0.75, bases 0.01" in line and "the largest part" in line


def test_processes_of_a_node_share_its_memory(monkeypatch):
    """Two CPU processes hold two projections: a team that fits one process's memory alone is refused for two."""
    import torch

    from collab.cli import resources
    from collab.envs import make_env

    module, env = _module(), make_env("debate", agents=3)
    one = resources.plan_team(module, env, 1, torch.device("cpu"))(3)[0].total
    monkeypatch.setattr(resources, "this_machine", lambda: _machine(1.5 * one / GB))
    monkeypatch.setattr("collab.runtime.projection.matmul_rate", lambda device, dtype: 1e12)
    assert resources.check_team(_trainer(1), module, env, 1) is not None  # fits: a large team's start line
    with pytest.raises(UserError, match=r"a process, 2 processes against .* of memory available"):
        resources.check_team(_trainer(2), module, env, 2)  # each process plays 1 of the 2 tasks


def test_a_full_team_that_fits_its_fsdp_processes_sharded_is_not_refused(monkeypatch):
    """Two full agents on tiny (t parameters, float32: 16 t each) at 2 processes: under ddp each process holds 32 t,
    under fsdp 16 t, and a backward pass gathers one agent's weights and gradients (8 t: MAGRPO's passes each run
    on one model). On a machine between the two projections ddp's 2 processes are refused and fsdp's run; the
    refusal names what fsdp gathers."""
    from types import SimpleNamespace

    import torch

    from collab.cli import resources
    from collab.envs import make_env
    from collab.policy.team import AgentSpec, SamplingSpec

    tiny = KNOWN_PARAMS["tiny"]
    full = AgentSpec(finetune="full", sampling=SamplingSpec(max_new_tokens=16))
    module, env = _module(agents=[full, full]), make_env("debate", agents=2)
    ddp = resources.plan_team(module, env, 1, torch.device("cpu"))(2)[0]
    fsdp = resources.plan_team(module, env, 1, torch.device("cpu"), shards=2)(2)[0]
    assert (ddp.bases, ddp.adapters, ddp.gathered) == (0, 32 * tiny, 0)
    assert (fsdp.bases, fsdp.adapters, fsdp.gathered) == (0, 16 * tiny, 8 * tiny)
    assert fsdp.total < ddp.total
    monkeypatch.setattr(resources, "this_machine", lambda: _machine(2 * (fsdp.total + ddp.total) / 2 / GB))
    with pytest.raises(UserError, match="2 processes against"):
        resources.check_team(_trainer(2), module, env, 2)
    sharded = SimpleNamespace(**{**vars(_trainer(2)), "strategy": SimpleNamespace(shards=2)})
    assert resources.check_team(sharded, module, env, 2) is None
    monkeypatch.setattr(resources, "this_machine", lambda: _machine(0.1))
    with pytest.raises(UserError, match="an fsdp backward pass gathers whole"):
        resources.check_team(sharded, module, env, 2)


def test_a_large_team_that_fits_says_its_projection(monkeypatch):
    """Three agents (more than the packaged 2) on 64 GiB: the start line gives the projected memory, its parts and a
    step's projected time at the (faked) matmul rate; two agents say nothing, unless their step is long."""
    import torch

    from collab.cli import resources, team_lines
    from collab.envs import make_env
    from collab.runtime.projection import step_flops

    monkeypatch.setattr(resources, "this_machine", lambda: _machine(64))
    monkeypatch.setattr("collab.runtime.projection.matmul_rate", lambda device, dtype: 1e9)
    module, env = _module(), make_env("debate", agents=3)
    line = resources.check_team(_trainer(), module, env, 2)
    projection, work, shape = resources.plan_team(module, env, 2, torch.device("cpu"))(3)
    seconds = step_flops(work, shape, 4) / 1e9  # LoRA agents: 4 x the parameters a trained token
    assert line.startswith(
        f"team: 3 agents, projected {projection.total / GB:.2f} GiB a process of 64.00 GiB available"
    )
    assert f"a step projected at about {team_lines.duration(seconds)} (" in line and "at 1 GFLOP/s" in line
    assert f"{sum(work.rows(t) for t in range(work.turns)):,} responses" in line and "\n" not in line
    pair = make_env("debate", agents=2)
    assert resources.check_team(_trainer(), module, pair, 2) is None
    monkeypatch.setattr("collab.runtime.projection.matmul_rate", lambda device, dtype: 1.0)  # a step of days
    assert resources.check_team(_trainer(), module, pair, 2).startswith("team: 2 agents, projected ")


def test_a_crossed_tree_of_many_agents_is_refused_whatever_the_machine(monkeypatch):
    """K^agents joint actions a node: 4^40 cannot be held, and would never end being listed."""
    from collab.cli import resources
    from collab.envs import make_env

    monkeypatch.setattr(resources, "this_machine", lambda: _machine(1024))
    with pytest.raises(UserError, match=r"40 agents project .*at most \d+ agents fit here.*the step's experience"):
        resources.check_team(_trainer(), _module(joint_mode="cross"), make_env("debate", agents=40), 2)


def test_a_team_of_unknown_size_is_not_checked(monkeypatch):
    from collab.cli import resources
    from collab.envs import make_env
    from collab.policy.team import AgentSpec, SamplingSpec

    monkeypatch.setattr(resources, "this_machine", lambda: _machine(0.1))
    module = _module(agents=[AgentSpec(base="no-such-org/no-such-model", sampling=SamplingSpec(max_new_tokens=16))])
    assert resources.check_team(_trainer(), module, make_env("debate", agents=3), 2) is None


@pytest.mark.parametrize("agents, early", [(3, False), (33, True)])
def test_a_team_too_large_to_build_quickly_shows_its_start_lines_at_once(agents, early, monkeypatch):
    """More than 32 agents: the held start lines are printed before the adapters are built (minutes)."""
    from collab.cli import output, resources
    from collab.envs import make_env

    monkeypatch.setattr(resources, "this_machine", lambda: _machine(64))
    monkeypatch.setattr("collab.runtime.projection.matmul_rate", lambda device, dtype: 1e12)
    noted, shown = [], []
    monkeypatch.setattr(output, "note", noted.append)
    monkeypatch.setattr(output, "show_notes", lambda: shown.append(True))
    resources.prepare_processes(_trainer(), _module(), 60.0, make_env("debate", agents=agents), 2)
    assert len(noted) == 1 and noted[0].startswith(f"team: {agents} agents, projected ")
    assert bool(shown) == early


def test_the_cli_refuses_a_team_that_cannot_fit_before_loading_any_model(tmp_path, monkeypatch, capsys):
    from collab.cli import resources
    from collab.fit import main
    from collab.policy import pool

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(pool, "load_model", no_loading)
    monkeypatch.setattr(resources, "this_machine", lambda: _machine(0.9))
    monkeypatch.chdir(tmp_path)
    code = main(
        [
            *("--algo", "magrpo", "--data.env", "debate", "--data.env_options", "{agents: 6}"),
            *("--model.base.name", "tiny", "--trainer.accelerator", "cpu", "--data.batch_size", "2"),
            *("--model.num_generations", "2", "--model.decode_memory_gb", "0.25"),
            *("--model.micro_batch_memory_gb", "0.25"),
            *("--model.agents", "[{sampling: {max_new_tokens: 16}}]"),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("error: the team does not fit this machine: 6 agents project ") and "at most" in err[0]
    assert not (tmp_path / "runs").exists()


def test_the_cli_says_a_large_teams_projection_in_its_start_lines(tmp_path, monkeypatch, capsys):
    """A 3-player matrix game, one step: the run's start lines (configs, threads, team) and its end."""
    from collab.fit import main

    monkeypatch.chdir(tmp_path)
    code = main(
        [
            *("--algo", "magrpo", "--data.env", "matrix", "--data.env_options", "{players: 3}"),
            *("--model.base.name", "tiny", "--trainer.accelerator", "cpu", "--trainer.max_steps", "1"),
            *("--data.batch_size", "1", "--trainer.logger", "false"),
        ]
    )
    err = capsys.readouterr().err.splitlines()
    assert code == 0, err[-20:]
    start = [line for line in err if line.startswith(("config: ", "threads: ", "team: "))]
    assert [line.split(":")[0] for line in start] == ["config", "threads", "team"], start
    assert start[2].startswith("team: 3 agents, projected ") and "a step projected at " in start[2]


def test_whole_episodes_and_at_grpos_tree_are_counted_without_branching():
    """MAGRPO's ``rollout_mode: episodes`` decodes K responses an agent a task at every turn (K episodes going on
    alone): 3 agents, 2 tasks, K = 5, 4 turns are 30 responses a turn, 120 a step, where its tree holds 30 x 5^t."""
    from types import SimpleNamespace

    from collab.cli.resources import tree
    from collab.runtime.projection import Workload

    module = SimpleNamespace(joint_mode="aligned", k=5, rollout_mode="episodes")
    samples, branching = tree(module, None, 3)
    work = Workload(2, 3, 8, (10, 20, 30, 40), samples, branching)
    assert [work.rows(t) for t in range(4)] == [30, 30, 30, 30]
    module.rollout_mode = "tree"
    work = Workload(2, 3, 8, (10, 20, 30, 40), *tree(module, None, 3))
    assert [work.rows(t) for t in range(4)] == [30, 150, 750, 3750]
    module.keep = "best"  # AT-GRPO's tree: only the best joint action of a turn goes on
    assert tree(module, None, 3) == (5, 1)
