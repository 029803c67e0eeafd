"""The papers' datasets as their publishers ship them: where each is published, its files and fields.

No dataset below ships in a PyPI package, so none can be loaded on a machine without the hub: the user
downloads the publisher's file once and an environment option names it as ``NAME:PATH``
(``dataset: "tldr:data/tldr/data/train-*.parquet"``). The file keeps the publisher's format and field
names (:mod:`collab.envs.records` reads json, jsonl, csv and parquet, and ``*`` patterns of shards), so
what the paper trained on is what collab reads, with no conversion step in between.

A missing file, or one without the fields the publisher's records have, ends in one line that names the
dataset, where it is published, the path that was given and the format expected: the user can fetch the
right file without reading any code. docs/data.md has the table of every dataset, its paper and split.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collab.envs.records import load_records, record_files
from collab.errors import UserError

__all__ = ["Published", "PUBLISHED", "read_published", "split_source"]


@dataclass(frozen=True)
class Published:
    """A dataset as published: ``where`` (a hub id or a repository URL), ``files`` (its files there, with
    their splits), the fields every record has (``fields``, checked) and its file format."""

    name: str
    where: str
    files: str
    fields: tuple[str, ...]
    format: str = ".parquet (or the same records as .jsonl / .json)"

    def expected(self) -> str:
        """What a file of this dataset must be, for error messages."""
        return f"a {self.format} file, or a * pattern of its shards, whose records have {', '.join(self.fields)}"


HUB = "the Hugging Face hub as "
PUBLISHED: dict[str, Published] = {
    p.name.lower(): p
    for p in (
        Published("TLDR", HUB + "trl-lib/tldr", "data/{train,validation,test}-*.parquet", ("prompt",)),
        # MAGRPO's expansion task; abstract_text is one string (the authors' processing joined the sentences)
        Published(
            "arXiv",
            HUB + "OpenMLRL/arXiv_abstract",
            "data/{train,val,test}-*.parquet",
            ("article_id", "abstract_text", "token_count"),
        ),
        Published(
            "CoopHumanEval",
            HUB + "OpenMLRL/CoopHumanEval",
            "data/test-*.parquet (its one split, test: 82 problems)",
            ("task_id", "prompt", "test", "entry_point"),
        ),
        Published(
            "HouseBuild",
            "https://github.com/OpenMLRL/LLM_Collab_Minecraft",
            "house_build/dataset/data.json (10 tasks)",
            ("task_id", "inventory", "target_spec"),
            ".json list",
        ),
        Published(
            "BoxBuilder",
            "https://github.com/OpenMLRL/LLM_Collab_Minecraft (in its history: HouseBuild's earlier name)",
            "dataset/box_builder/data.json at commit e93c34c (10 tasks; the next commit renamed it house_builder)",
            ("task_id", "palette", "target_spec"),
            ".json list",
        ),
        Published(
            "ClassEval",
            "https://github.com/FudanSELab/ClassEval",
            "data/ClassEval_data.json (100 classes)",
            ("task_id", "skeleton", "test"),
            ".json list",
        ),
        Published(
            "CodeForces",
            HUB + "open-r1/codeforces",
            "data/train-*.parquet, data/test-*.parquet",
            ("description", "input_format", "output_format"),
        ),
        Published(
            "MARFT",
            "https://github.com/jwliao-ai/MARFT",
            "marft/envs/math/benchmarks/MATH/train.json (7500), MATH/test.json, cmath/cmath_test.json...",
            ("problem", "final_answer"),
            ".json list",
        ),
        Published(
            "AIME_1983_2024",
            HUB + "di-zhang-fdu/AIME_1983_2024",
            "AIME_Dataset_1983_2024.csv (933 problems)",
            ("Question", "Answer"),
            ".csv",
        ),
        Published("GSM8K", HUB + "openai/gsm8k", "main/{train,test}-*.parquet", ("question", "answer")),
        Published("TinyGSM", HUB + "TinyGSM/TinyGSM", "data/train-*.parquet", ("question", "code")),
        Published(
            "DrMAS_math",
            "https://github.com/langfengQ/DrMAS (written by its examples/data_preprocess/drmas_math.py)",
            "train.parquet (aaabiao/dapo_filter), test.parquet (MATH-500, AIME 2024 and 2025, OlympiadBench, AMC-23, "
            "Minerva), test_sampled.parquet (MATH-500's first 50, AIME 2024 and 2025)",
            ("env_kwargs",),
        ),
        Published(
            "ANLI",
            HUB + "facebook/anli",
            "plain_text/{train,dev,test}_r{1,2,3}-*.parquet",
            ("hypothesis", "label"),
        ),
    )
}


def split_source(value: str, names: tuple[str, ...]) -> tuple[str | None, str]:
    """``("tldr", PATH)`` for ``"tldr:PATH"`` when ``tldr`` is one of ``names``, else ``(None, value)``:
    a plain path keeps meaning the generic local format of its environment."""
    name, sep, path = value.partition(":")
    if sep and name.lower() in names:
        return name.lower(), path
    return None, value


def read_published(name: str, path: str | Path) -> list[dict[str, Any]]:
    """The records of published dataset ``name`` read from the local ``path``, checked for its fields.

    Every failure is one line that starts with the dataset and where it is published."""
    dataset = PUBLISHED[name]
    head = f"{dataset.name} (published on {dataset.where}: {dataset.files})"
    if not str(path).strip():
        raise UserError(f"{head}: needs a path: pass {name}:PATH, PATH {dataset.expected()}")
    if not record_files(path):
        raise UserError(f"{head}: file not found: {path}; download it, then pass its path: {dataset.expected()}")
    try:
        return load_records(path, required=dataset.fields)
    except UserError as e:
        raise UserError(f"{head}: {e}; expected {dataset.expected()}") from None
