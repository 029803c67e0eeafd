"""Each paper's dataset read from a small file written here in its publisher's format (no download): the hub's
parquet with its field names (TLDR, CoopHumanEval, CodeForces, GSM8K, TinyGSM, ANLI), the authors' json files
(HouseBuild, MARFT's MATH) and csv (AIME 1983-2024); the tasks and splits each env makes of them; a missing
file or a missing field in one line naming the dataset, where it is published and what is expected."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collab.envs.coding.tasks import load_tasks
from collab.envs.competitive_coding.env import CompetitiveCodingEnv
from collab.envs.debate.env import DebateEnv
from collab.envs.math.env import MathEnv
from collab.envs.math.published import whole_number
from collab.envs.minecraft.env import MinecraftEnv
from collab.envs.published import read_published, split_source
from collab.envs.records import load_records
from collab.envs.writing.env import WritingEnv
from collab.errors import UserError

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"


def parquet(path: Path, rows: list[dict]) -> str:
    """``rows`` written as the hub writes a split's shard (the tests that need one skip without pyarrow)."""
    pa = pytest.importorskip("pyarrow", reason="pip install pyarrow (the hub's parquet files)")
    pq = pytest.importorskip("pyarrow.parquet")
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def one_line(call, *needles: str) -> str:
    with pytest.raises(UserError) as e:
        call()
    text = str(e.value)
    assert "\n" not in text and all(n in text for n in needles), text
    return text


def test_readers_of_every_format(tmp_path):
    parquet(tmp_path / "data" / "train-00001-of-00002.parquet", [{"a": 3}, {"a": 4}])
    parquet(tmp_path / "data" / "train-00000-of-00002.parquet", [{"a": 1}, {"a": 2}])
    parquet(tmp_path / "data" / "test-00000-of-00001.parquet", [{"a": 9}])
    assert [r["a"] for r in load_records(tmp_path / "data" / "train-*.parquet")] == [1, 2, 3, 4]  # shards in order
    (tmp_path / "t.csv").write_text('Question,Answer\n"a, b",7\nc,080\n')
    assert load_records(tmp_path / "t.csv") == [{"Question": "a, b", "Answer": "7"}, {"Question": "c", "Answer": "080"}]
    (tmp_path / "lines.json").write_text('{"x": 1}\n{"x": 2}\n')  # the datasets library's to_json output
    assert load_records(tmp_path / "lines.json") == [{"x": 1}, {"x": 2}]
    (tmp_path / "broken.parquet").write_text("not parquet")
    one_line(lambda: load_records(tmp_path / "broken.parquet"), "broken.parquet", "not a readable parquet file")
    assert split_source("tldr:/a/b:c.parquet", ("tldr",)) == ("tldr", "/a/b:c.parquet")
    assert split_source("/a/tldr:b.json", ("tldr",)) == (None, "/a/tldr:b.json")


def test_a_missing_file_or_field_is_one_line_naming_the_publisher(tmp_path):
    one_line(
        lambda: read_published("tldr", tmp_path / "data" / "train-*.parquet"),
        "TLDR",
        "trl-lib/tldr",
        "file not found",
        str(tmp_path / "data" / "train-*.parquet"),
        ".parquet",
        "prompt",
    )
    wrong = parquet(tmp_path / "wrong.parquet", [{"post": "a post"}])
    one_line(lambda: read_published("tldr", wrong), "trl-lib/tldr", "record 0 has no 'prompt'", "it has: post")
    one_line(lambda: MathEnv(dataset=f"marft:{tmp_path}/train.json").tasks("train"), "jwliao-ai/MARFT", "final_answer")
    one_line(lambda: load_tasks("coophumaneval"), "OpenMLRL/CoopHumanEval", "needs a path")


def test_tldr_from_the_hubs_parquet(tmp_path):
    train = [{"prompt": f"SUBREDDIT: r/x\nPOST: post {i}\nTL;DR:", "completion": f" short {i}"} for i in range(12)]
    parquet(tmp_path / "tldr" / "data" / "train-00000-of-00001.parquet", train)
    parquet(tmp_path / "tldr" / "data" / "test-00000-of-00001.parquet", [{"prompt": "test post", "completion": "t"}])
    env = WritingEnv(dataset=f"tldr:{tmp_path}/tldr/data/train-*.parquet")
    # 12 records: the last tenth (1) evaluates, the rest trains (C.1's [0:1000] / [1000:1100] on a full file)
    assert [t["prompt"] for t in env.tasks("eval")] == ["SUBREDDIT: r/x\nPOST: post 11\nTL;DR:"]
    assert len(env.tasks("train")) == 11 and env.tasks("train")[0]["completion"] == " short 0"
    env = WritingEnv(
        dataset=f"tldr:{tmp_path}/tldr/data/train-*.parquet",
        eval_dataset=f"tldr:{tmp_path}/tldr/data/test-*.parquet",
        train_split="[0:3]",
    )
    assert [t["prompt"] for t in env.tasks("eval")] == ["test post"]
    assert [t["completion"] for t in env.tasks("train")] == [" short 0", " short 1", " short 2"]
    assert "Query: test post" in env.observe(env.tasks("eval")[0])[0]


COOP = {
    "task_id": "CoopHumanEval/0",
    "prompt": 'def cube_of_prime(n):\n    """The cube of the nth prime."""\n',
    "test": "def check(candidate):\n    assert candidate(1) == 8\n    assert candidate(2) == 27\n",
    "entry_point": "cube_of_prime",
}


def test_coophumaneval_from_the_hubs_parquet(tmp_path):
    rows = [{**COOP, "task_id": f"CoopHumanEval/{i}"} for i in range(3)]
    path = parquet(tmp_path / "CoopHumanEval" / "data" / "test-00000-of-00001.parquet", rows)
    explicit = load_tasks(f"coophumaneval:{tmp_path}/the-presets-path.parquet", path)  # the command line's path wins
    for tasks in (load_tasks(f"coophumaneval:{path}"), load_tasks("coophumaneval", path), explicit):
        assert [t["task_id"] for t in tasks] == ["CoopHumanEval/0", "CoopHumanEval/1", "CoopHumanEval/2"]
        assert tasks[0]["tests"] == ["assert candidate(1) == 8", "assert candidate(2) == 27"]
        assert tasks[0]["params"] == "n" and tasks[0]["source"] == "coophumaneval"
    bad = parquet(tmp_path / "bad.parquet", [{k: v for k, v in COOP.items() if k != "entry_point"}])
    one_line(lambda: load_tasks(f"coophumaneval:{bad}"), "OpenMLRL/CoopHumanEval", "'entry_point'")


@pytest.mark.skipif(not (SHARED / "coophumaneval.json").is_file(), reason="no shared/data/coophumaneval.json")
def test_the_published_coophumaneval_json():
    tasks = load_tasks(f"coophumaneval:{SHARED / 'coophumaneval.json'}")
    assert len(tasks) == 82 and tasks[0]["task_id"] == "CoopHumanEval/0" and tasks[16]["task_id"] == "CoopHumanEval/16"


HOUSE = {
    "task_id": "house_0",
    "inventory": {"A": "air", "S": "stone"},
    "count": {"S": 2},
    "target_spec": {"type": "y_layers", "size": [2, 1, 1], "layers": [{"y": 0, "rows": ["SS"]}]},
    "bbox": {"from": [0, 0, 0], "to": [1, 0, 0]},
}


def test_housebuild_from_the_authors_json(tmp_path):
    path = tmp_path / "data.json"
    path.write_text(json.dumps([{**HOUSE, "task_id": f"house_{i}"} for i in range(10)]))
    env = MinecraftEnv(dataset=f"housebuild:{path}")
    assert [t["task_id"] for t in env.tasks("eval")] == ["house_8", "house_9"]
    assert len(env.tasks("train")) == 8
    one_line(
        lambda: MinecraftEnv(dataset=f"housebuild:{tmp_path}/none.json"),
        "HouseBuild",
        "github.com/OpenMLRL/LLM_Collab_Minecraft",
        "house_build/dataset/data.json",
    )


@pytest.mark.skipif(not (SHARED / "housebuild.json").is_file(), reason="no shared/data/housebuild.json")
def test_the_published_housebuild_json():
    env = MinecraftEnv(dataset=f"housebuild:{SHARED / 'housebuild.json'}", train_split="[0:8]", eval_split="[8:10]")
    assert (len(env.tasks("train")), len(env.tasks("eval"))) == (8, 2)


def codeforces(pid: str, note: str | None = None) -> dict:
    """A record of open-r1/codeforces (its nested examples and official_tests, lists of input/output)."""
    return {
        "id": pid,
        "contest_id": pid.split("/")[0],
        "index": pid.split("/")[1],
        "title": "Sum",
        "description": "Add two numbers.",
        "input_format": "Two integers.",
        "output_format": "Their sum.",
        "interaction_format": None,
        "note": note,
        "examples": [{"input": "1 2\n", "output": "3\n"}],
        "official_tests": [{"input": "1 2\n", "output": "3\n"}, {"input": "5 5\n", "output": "10\n"}],
        "time_limit": 1.0,
        "memory_limit": 256.0,
        "rating": 800,
        "generated_checker": None,
    }


def test_codeforces_from_the_hubs_parquet(tmp_path):
    parquet(tmp_path / "data" / "train-00000-of-00002.parquet", [codeforces("1/A"), codeforces("1/B")])
    parquet(tmp_path / "data" / "train-00001-of-00002.parquet", [codeforces("2/A", note="Any case.")])
    parquet(tmp_path / "data" / "test-00000-of-00001.parquet", [codeforces("9/C")])
    env = CompetitiveCodingEnv(
        dataset=f"codeforces:{tmp_path}/data/train-*.parquet", eval_dataset=f"codeforces:{tmp_path}/data/test-*.parquet"
    )
    assert [t["id"] for t in env.tasks("train")] == ["1/A", "1/B", "2/A"]
    assert [t["id"] for t in env.tasks("eval")] == ["9/C"]
    assert env.tasks("eval")[0]["tests"] == [{"input": "1 2\n", "output": "3\n"}, {"input": "5 5\n", "output": "10\n"}]
    assert env.tasks("train")[0]["statement"].startswith("Execution time limit: 1.0 seconds\nMemory limit: 256.0 MB")
    one_line(
        lambda: CompetitiveCodingEnv(dataset=f"codeforces:{tmp_path}/data/validation-*.parquet"),
        "open-r1/codeforces",
        "validation-*.parquet",
    )


def test_math_from_marfts_json_and_the_aime_csv(tmp_path):
    train = tmp_path / "MATH" / "train.json"
    train.parent.mkdir()
    records = [{"problem": "What is $1+1$?", "final_answer": "2"}, {"problem": "P", "final_answer": 17}]
    train.write_text(json.dumps(records))
    env = MathEnv(dataset=f"marft:{train}", eval_dataset=f"marft:{train}", eval_split="[1:]")
    assert [(t["problem"], t["answer"]) for t in env.tasks("train")] == [("What is $1+1$?", "2"), ("P", "17")]
    assert [t["answer"] for t in env.tasks("eval")] == ["17"]
    csv = tmp_path / "AIME_Dataset_1983_2024.csv"
    csv.write_text(
        "ID,Year,Problem Number,Question,Answer,Part\n"
        '1983-1,1983,1,"Let $x$, $y$ be reals. Find $x$.",60,\n'
        "2024-II-15,2024,15,Find $N$.,080,II\n"
    )
    env = MathEnv(dataset=f"aime_1983_2024:{csv}", train_split="[:]", eval_split="[1:]")
    assert [(t["id"], t["answer"]) for t in env.tasks("train")] == [
        ("aime_1983_2024/1983-1", "60"),
        ("aime_1983_2024/2024-II-15", "080"),
    ]
    assert env.tasks("train")[0]["problem"] == "Let $x$, $y$ be reals. Find $x$."
    assert env.grade(env.tasks("eval")[0], "so \\boxed{80}")[0] == 1.0


def test_gsm8k_and_tinygsm_from_the_hubs_parquet(tmp_path):
    gsm = parquet(tmp_path / "main" / "train-00000-of-00001.parquet", [{"question": "Q?", "answer": "3+4=7\n#### 7"}])
    env = MathEnv(dataset=f"gsm8k:{gsm}", train_split="[:]", eval_split="[:]")
    assert [(t["problem"], t["answer"]) for t in env.tasks("train")] == [("Q?", "7")]
    rows = [
        {"question": "Twice nine?", "code": "def simple_math_problem() -> int:\n    x = 9\n    return 2 * x\n"},
        {"question": "Half of five?", "code": "def simple_math_problem():\n    return 5 / 2\n"},
        {"question": "Noisy?", "code": "def simple_math_problem():\n    print('hi')\n    return 12.0\n"},
        {"question": "Broken?", "code": "def simple_math_problem():\n    return undefined_name\n"},
        {"question": "Not used", "code": "def simple_math_problem():\n    return 1\n"},
    ]
    tiny = parquet(tmp_path / "TinyGSM" / "data" / "train-00000-of-00001.parquet", rows)
    env = MathEnv(dataset=f"tinygsm:{tiny}", train_split="[:4]", eval_dataset=f"gsm8k:{gsm}")
    # answers are what the code returns, whole numbers only: 2.5 and the NameError leave their problems out
    assert [(t["problem"], t["answer"]) for t in env.tasks("train")] == [("Twice nine?", "18"), ("Noisy?", "12")]
    assert [t["problem"] for t in env.tasks("eval")] == ["Q?"]
    assert [whole_number(v) for v in (18, 18.0, 2.5, float("nan"), None)] == ["18", "18", None, None, None]


def test_anli_from_the_hubs_parquet_for_the_debate(tmp_path):
    def rows(n: int, tag: str) -> list[dict]:
        return [
            {"uid": f"{tag}{i}", "premise": f"P{i}.", "hypothesis": f"H{i}.", "label": i % 3, "reason": ""}
            for i in range(n)
        ]

    parquet(tmp_path / "plain_text" / "train_r3-00000-of-00001.parquet", rows(6, "t"))
    parquet(tmp_path / "plain_text" / "test_r3-00000-of-00001.parquet", rows(2, "x"))
    env = DebateEnv(
        dataset=f"anli:{tmp_path}/plain_text/train_r3-*.parquet",
        train_split="[2:5]",
        eval_dataset=f"anli:{tmp_path}/plain_text/test_r3-*.parquet",
    )
    assert [(t["id"], t["answer"]) for t in env.tasks("train")] == [
        ("anli/t2", "contradiction"),
        ("anli/t3", "entailment"),
        ("anli/t4", "neutral"),
    ]
    assert [t["problem"] for t in env.tasks("eval")] == [f"Premise: P{i}.\nHypothesis: H{i}." for i in (0, 1)]
    one_line(
        lambda: DebateEnv(dataset=f"anli:{tmp_path}/plain_text/dev_r3-*.parquet").tasks("eval"),
        "ANLI",
        "facebook/anli",
        "dev_r3-*.parquet",
    )
    one_line(lambda: DebateEnv(dataset="cb", eval_dataset="gsm8k"), "unknown nli debate dataset 'gsm8k'")


def test_dr_mas_math_files(tmp_path):
    """Dr. MAS's preprocessed parquet files: the problem and ground truth from ``env_kwargs``, numbered by source."""
    rows = [
        {"env_kwargs": {"question": "Find $x$ if $2x=6$.", "ground_truth": "3", "data_source": "dapo_filter"}},
        {"env_kwargs": {"question": "AIME Q", "ground_truth": "204", "data_source": "aime24"}},
    ]
    path = parquet(tmp_path / "train.parquet", rows)
    env = MathEnv(dataset=f"drmas_math:{path}", train_split="[:]", eval_split="[1:]")
    got = [(t["id"], t["problem"], t["answer"]) for t in env.tasks("train")]
    assert got == [("drmas_math/dapo_filter/0", "Find $x$ if $2x=6$.", "3"), ("drmas_math/aime24/1", "AIME Q", "204")]
    assert env.grade(env.tasks("eval")[0], "so \\boxed{204}")[0] == 1.0
    with pytest.raises(UserError, match="DrMAS_math .published on https://github.com/langfengQ/DrMAS") as e:
        MathEnv(dataset=f"drmas_math:{tmp_path / 'missing.parquet'}").tasks("train")
    assert "\n" not in str(e.value)
