"""Quiet output: a run prints collab's own lines and no library's deprecation warnings.

The quick start's command (``python -m collab.fit --algo marft_a``, the embedded model, cut to one rollout)
runs with every DeprecationWarning and FutureWarning turned into an error, its stdout a pipe (not a
terminal): it must end well, with no warning on stderr and none of Lightning's chatter (the model summary
table, "GPU available", "LOCAL_RANK", "Seed set"), while collab's lines are all there. The few warnings
that a library raises about its own code are ignored by one filter each (``collab.runtime.library_warnings.
LIBRARY_WARNINGS``), which the last tests check match their message from their module only.
"""

import io
import json
import logging
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STRICT = [
    "-W",
    "error::DeprecationWarning",
    "-W",
    "error::FutureWarning",
    # torch's own torch.utils.mkldnn calls its deprecated torch.jit.script_method when torch's compiler is
    # imported (bitsandbytes compiles a kernel at import); hidden by Python's default filters
    "-W",
    "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning:torch.jit._script",
]
# A machine with many cores, where Lightning asks a DataLoader for worker processes (the GPU machines have 16)
MANY_CORES = "import lightning.fabric.utilities.data as d; d._num_cpus_available = lambda: 16\n"
CHATTER = (
    "┏",
    "Trainable params",
    "Total params",
    "GPU available",
    "TPU available",
    "HPU available",
    "LOCAL_RANK",
    "Seed set",
    "Trainer.fit` stopped",
    "litlogger",
    "Loading weights",
)
"""Lightning's model summary and information lines, transformers' progress bars."""
WARNING = re.compile(r"\w+Warning\b|\.py:\d+: ")
"""A warning as Python shows it (``file.py:12: FutureWarning: ...``) or as Lightning does (``file.py:12: ...``)."""


def command(entry: str, *args: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    """``collab.<entry>.main(ARGS)`` in a new Python with the strict warning options and stdout a pipe, on a machine
    that Lightning takes for one with 16 cores."""
    code = MANY_CORES + f"import sys; from collab.{entry} import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(
        [sys.executable, *STRICT, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def assert_quiet(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, result.stderr[-3000:]
    warned = [line for line in result.stderr.splitlines() if WARNING.search(line)]
    assert not warned, result.stderr[-3000:]
    said = [line for line in (result.stdout + result.stderr).splitlines() if any(c in line for c in CHATTER)]
    assert not said, said


@pytest.mark.slow
def test_quick_start_is_quiet_and_reports_its_held_out_figures(tmp_path):
    """The README's main job itself (MARFT-A, a DUO of embedded SmolLM2 agents on math), cut to one rollout of 2
    tasks and an eval split of 2 problems (the default's 64 are checked in test_cli.py): it ends well and quietly,
    prints collab's lines, and writes its summary, scalars and adapters."""
    # ~40 s alone on 2 cores; 30 minutes leave room for a loaded machine
    result = command(
        "fit",
        "--algo",
        "marft_a",
        "--trainer.max_steps",
        "1",
        "--data.env_options.num_eval",
        "2",
        "--data.batch_size",
        "2",
        cwd=tmp_path,
        timeout=1800,
    )
    assert_quiet(result)
    assert result.stderr.startswith("config: ")  # which configs the run read (collab's line)
    assert re.search(r"^threads: \d+ a process \(", result.stderr, re.M), result.stderr  # said once
    assert sum(line.startswith("threads: ") for line in result.stderr.splitlines()) == 1
    for line in (
        "evaluation at step 0 (2 eval tasks",
        "step 1/1  reward ",  # stdout is a pipe: one plain line per rollout
        "reward: mean of first 1 rollouts",
        "held-out accuracy (2 eval problems, greedy): before ",  # the default's before/after
    ):
        assert line in result.stdout, result.stdout
    run = tmp_path / "runs" / "marft_a" / "version_0"
    held_out = json.loads((run / "reward_summary.json").read_text())["held_out"]
    assert held_out["problems"] == 2 and held_out["greedy"] and held_out["before_se"] >= 0  # an SE: 2+ problems
    from collab.evaluation.analysis import read_scalars

    scalars = read_scalars(run)
    assert {
        "reward/return",
        "reward/avg_step_reward",
        "env/correct",
        "train/critic_loss",
        "train/entropy",
        "rollout/tokens_per_s",
    } <= set(scalars)
    assert (run / "adapters" / "last" / "agent1" / "adapter_config.json").is_file()


def test_evaluate_is_quiet(tmp_path):
    result = command(
        "evaluate",
        "--algo",
        "marft_a",
        "--model.base.name",
        "tiny",
        "--trainer.accelerator",
        "cpu",
        "--num_samples",
        "1",
        "--k",
        "1",
        "--max_tasks",
        "2",
        cwd=tmp_path,
    )
    assert_quiet(result)
    assert "marft_a on math (eval: 2 tasks x 1 samples; weights: untrained)" in result.stdout, result.stdout


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("terminal", [False, True], ids=["pipe", "terminal"])
def test_command_output_puts_the_libraries_back(terminal, monkeypatch):
    """Lightning's information lines and transformers' progress bars are off for a command whose stdout is not a
    terminal (on for a terminal), and as they were after it: a notebook or test that calls ``main`` goes on alike."""
    import lightning.pytorch  # noqa: F401 (its import sets its loggers' levels)
    from transformers.utils import logging as transformers_logging

    from collab.cli import output

    names = ("lightning.pytorch", "lightning.fabric", "bitsandbytes")
    before = [logging.getLogger(n).level for n in names], transformers_logging.is_progress_bar_enabled()
    monkeypatch.setattr(sys, "stdout", _Terminal() if terminal else io.StringIO())
    with output.command_output():
        output.hold_logs()  # as build_cli does
        levels = [logging.getLogger(n).level for n in names[:2]]
        assert levels == (before[0][:2] if terminal else [logging.WARNING] * 2)
        assert transformers_logging.is_progress_bar_enabled() == (terminal and before[1])
        assert logging.getLogger("bitsandbytes").level == logging.ERROR
    assert ([logging.getLogger(n).level for n in names], transformers_logging.is_progress_bar_enabled()) == before


LIBRARY_MESSAGES = {  # as Lightning 2.6, peft 0.21 on transformers 5.24 and jsonargparse 4.53 raise them
    "is_gradient_checkpointing": (
        "`is_gradient_checkpointing` is deprecated and will be removed in v6. "
        "Use `is_activation_checkpointing` instead.",
        FutureWarning,
        "transformers.modeling_utils",
    ),
    "LeafSpec": (
        "`isinstance(treespec, LeafSpec)` is deprecated, use `isinstance(treespec, TreeSpec) and treespec.is_leaf()` "
        "instead.",
        FutureWarning,
        "lightning.pytorch.utilities._pytree",
    ),
    "dataloader_iter flavor": (
        "You are using the `dataloader_iter` step flavor. If you consume the iterator more than once per step, ...",
        UserWarning,
        "lightning.pytorch.trainer.configuration_validator",
    ),
    "dataloader_iter argument": (
        "Found `dataloader_iter` argument in the `training_step`. Note that the support for this signature is "
        "experimental and the behavior is subject to change.",
        UserWarning,
        "lightning.pytorch.loops.utilities",
    ),
    "no workers": (
        "The 'train_dataloader' does not have many workers which may be a bottleneck. Consider increasing the value of "
        "the `num_workers` argument` to `num_workers=15` in the `DataLoader` to improve performance.",
        UserWarning,
        "lightning.pytorch.trainer.connectors.data_connector",
    ),
    "jsonargparse notice": (
        "\n    By default only one JsonargparseDeprecationWarning per type is shown. To see all warnings set "
        "environment\n"
        "    variable JSONARGPARSE_DEPRECATION_WARNINGS=all and to disable the warnings set\n"
        "    JSONARGPARSE_DEPRECATION_WARNINGS=off.\n",
        DeprecationWarning,
        "lightning.pytorch.cli",
    ),
    "add_instantiator": (
        "\n    ``ArgumentParser.add_instantiator`` was deprecated in v4.49.0 and will be removed in v5.0.0. "
        "Instead use the\n    ``instantiators`` parameter of ``instantiate``, ``auto_cli`` or ``from_config``.\n",
        DeprecationWarning,
        "lightning.pytorch.cli",
    ),
    "instantiate_classes": (
        "\n    ``instantiate_classes`` was deprecated in v4.49.0 and will be removed in v5.0.0. Instead use "
        "``instantiate``.\n",
        DeprecationWarning,
        "lightning.pytorch.cli",
    ),
    "skip_none": (
        "\n    skip_none parameter was deprecated in v4.49.0 and will be removed in v5.0.0. Instead use skip_unset.\n",
        DeprecationWarning,
        "lightning.pytorch.cli",
    ),
}


@pytest.mark.parametrize("name", LIBRARY_MESSAGES)
def test_library_warnings_are_ignored_from_their_module_only(name):
    from collab.runtime.library_warnings import ignore_library_warnings

    message, category, module = LIBRARY_MESSAGES[name]
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        ignore_library_warnings()
        warnings.warn_explicit(message, category, "library.py", 1, module=module)
        warnings.warn_explicit(message, category, "mine.py", 1, module="collab.mine")  # the same from collab's code
        warnings.warn_explicit("another message", category, "library.py", 1, module=module)
    assert [(w.filename, str(w.message)) for w in shown] == [("mine.py", message), ("library.py", "another message")]
