"""The embedded model's converted folder (collab.policy.models._smollm2_folder): made once, and an incomplete
folder (a process killed while writing it) replaced instead of making every later process convert again."""

from __future__ import annotations

import pytest


@pytest.fixture
def converting(monkeypatch, tmp_path, tiny_tokenizer):
    """The GGUF conversion replaced by the tiny model and tokenizer; counts the conversions."""
    import transformers

    from collab.policy import models

    calls = []

    def model(*args, **kwargs):
        calls.append(args)
        return models.tiny_llama(len(tiny_tokenizer))

    monkeypatch.setenv("COLLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(models, "_smollm2_gguf_dir", lambda: tmp_path)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", model)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: tiny_tokenizer)
    return calls


def test_an_incomplete_folder_is_replaced_once(converting, tmp_path):
    from collab.policy.models import _complete, _smollm2_folder

    target = tmp_path / "smollm2-135m-instruct"
    target.mkdir()
    (target / "tokenizer.json").write_text("{}")  # a half-written folder: tokenizer files, no config, no weights
    assert not _complete(target)
    assert _smollm2_folder() == target and _complete(target) and len(converting) == 1
    assert _smollm2_folder() == target and len(converting) == 1  # complete now: not converted again
    assert sorted(p.name for p in tmp_path.iterdir()) == ["smollm2-135m-instruct"]  # no temporary folder left
