"""``--print_config`` says whether each batch size is global or per process, and stays a config
that reads back."""

from __future__ import annotations

import pytest
import yaml

from collab.training.batch_scope import SCOPES, annotate


def test_annotate_by_path():
    text = (
        "trainer:\n  callbacks:\n  - class_path: collab.training.callbacks.EvaluationCallback\n    init_args:\n"
        "      max_tasks: 30\n      tasks_per_batch: 4\n  limit_train_batches: null\n"
        "model:\n  ppo:\n    minibatch_size: 16\n"
        "  micro_batch_tokens: null\n  base:\n    name: tiny\ndata:\n  env: math\n  batch_size: 8\n"
        "other:\n  batch_size: 3\n"
    )
    lines = annotate(text).splitlines()
    assert lines[4] == f"      max_tasks: 30  # {SCOPES['max_tasks']}"
    assert lines[5] == f"      tasks_per_batch: 4  # {SCOPES['tasks_per_batch']}"
    assert lines[9] == f"    minibatch_size: 16  # {SCOPES['model.ppo.minibatch_size']}"
    assert lines[10].endswith("# per process: padded tokens per forward/backward")
    assert lines[15] == f"  batch_size: 8  # {SCOPES['data.batch_size']}"
    assert lines[17] == "  batch_size: 3"  # not data.batch_size: left alone
    assert lines[6] == "  limit_train_batches: null" and yaml.safe_load(annotate(text)) == yaml.safe_load(text)
    assert SCOPES["data.batch_size"].startswith("global") and SCOPES["model.ppo.minibatch_size"].startswith(
        "per process"
    )


def test_print_config_says_global_or_per_process(tmp_path, monkeypatch, capsys):
    from collab.fit import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["--algo", "marft_a", "--print_config"])
    assert exit_.value.code in (0, None)
    out = capsys.readouterr().out
    assert "  batch_size: 8  # global: tasks per step over all processes" in out
    assert "    minibatch_size: null  # per process:" in out and "  micro_batch_tokens: auto  # per process:" in out
    assert "  micro_batch_memory_gb: null  # per process:" in out and "  decode_memory_gb: null  # per process:" in out
    # the annotated output is still a config: read back with --config, it prints the same values
    (tmp_path / "printed.yaml").write_text(out)
    with pytest.raises(SystemExit):
        main(["--algo", "marft_a", "--config", str(tmp_path / "printed.yaml"), "--print_config"])
    assert yaml.safe_load(capsys.readouterr().out) == yaml.safe_load(out)
