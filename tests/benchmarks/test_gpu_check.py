"""benchmarks/gpu_check.py where there is no GPU: its ``--cpu-smoke`` run at the tiny shape writes every section of
the report, with figures that obey the workload's sizes and parameter counts computed by hand, and lists what could
not run here with its reason; the largest-base search stops where memory runs out; scripts/gpu_check.sh and the
script refuse a machine without CUDA (outside the smoke mode) in one line."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.support.benchmarks import load, rows, section

ROOT = Path(__file__).resolve().parents[2]
PYTEST_LOG = """\
tests/policy/test_gpu.py .....s.                                    [100%]
=========================== short test summary info ============================
SKIPPED [1] tests/policy/test_gpu.py:137: needs bitsandbytes
6 passed, 1 skipped in 12.34s
"""


def qwen2_parameters(hidden: int, layers: int, heads: int, kv: int, inter: int, vocab: int, tied: bool) -> int:
    """A Qwen2 decoder's parameters: q/k/v with biases, o without; gate/up/down; two RMSNorms a layer and a final
    one; the embedding, and the output head when it is not tied to it."""
    d = hidden // heads
    attention = (hidden * hidden + hidden) + 2 * (hidden * kv * d + kv * d) + hidden * hidden
    return vocab * hidden * (1 if tied else 2) + layers * (attention + 3 * hidden * inter + 2 * hidden) + hidden


@pytest.fixture(scope="module")
def bench():
    return load("gpu_check")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> tuple[int, str]:
    """The script's ``--cpu-smoke`` run in a process of its own: (exit status, report)."""
    root = tmp_path_factory.mktemp("gpu_check")
    (root / "pytest.log").write_text(PYTEST_LOG)
    (root / "setup.md").write_text("- not installed: vllm: package index: no network\n")
    out = root / "report.md"
    env = {
        **os.environ,
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
    }
    proc = subprocess.run(
        [
            sys.executable,
            "benchmarks/gpu_check.py",
            "--cpu-smoke",
            "--out",
            str(out),
            "--setup",
            str(root / "setup.md"),
            "--tests-log",
            str(root / "pytest.log"),
            "--tests-status",
            "0",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.is_file(), proc.stderr[-3000:]
    return proc.returncode, out.read_text()


def test_the_smoke_run_writes_every_section_in_order(smoke):
    status, report = smoke
    assert status == 0, report
    titles = re.findall(r"^#+ (.+)$", report, re.M)
    expected = [
        "collab GPU check",
        "Setup",
        "GPU tests",
        "Rollout",
        "Training steps",
        "Largest base that fits",
        "Could not run",
    ]
    assert [t for t in titles if t != "QLoRA 4-bit"] == expected
    head = report.split("\n## ")[0]
    assert re.search(r"^- date: \d{4}-\d\d-\d\d \d\d:\d\d UTC$", head, re.M)
    assert "no CUDA device" in head and f"torch {torch.__version__}" in head and "mode: cpu-smoke" in head
    assert "336,448 parameters" in head  # the tiny Qwen2
    assert qwen2_parameters(64, 2, 4, 2, 128, 4096, True) == 336_448
    assert "- not installed: vllm: package index: no network" in section(report, "Setup")


def test_the_gpu_tests_summary_comes_from_the_pytest_log(smoke):
    text = section(smoke[1], "GPU tests")
    assert "`pytest -m gpu` (exit 0): 6 passed, 1 skipped in 12.34s" in text
    assert "- SKIPPED [1] tests/policy/test_gpu.py:137: needs bitsandbytes" in text


def test_the_figures_obey_the_workload(smoke):
    # 2 agents x 2 samples x 8 tokens at most (a response may end at EOS)
    rollout = rows(section(smoke[1], "Rollout"))
    assert len(rollout) == 2
    for row in rollout.values():
        assert 0 < int(row[1]) <= 32 and float(row[3]) > 0
    assert rollout["collab team.generate (both agents batched)"][4] == "1.00"
    steps = rows(section(smoke[1], "Training steps"))
    # MAGRPO: 2 posts x 2 agents x K=2 x 8 tokens; MARFT-A: 2 problems x 2 agents x 8 tokens
    assert 0 < float(steps["MAGRPO"][4]) <= 64 and 0 < float(steps["MARFT-A"][4]) <= 32
    for row in steps.values():
        assert float(row[3]) <= float(row[2])  # the rollout is part of the step
        assert row[6] == row[7] == "-"  # no CUDA memory figures on the CPU
    # with random weights every writing reward is the same: MAGRPO trains every sample (2 posts x 2 agents x K=2)
    # only through the benchmark's KL penalty; without it the step would be a rollout alone (0 trained)
    assert steps["MAGRPO"][5] == "8"
    assert rows(section(smoke[1], "QLoRA 4-bit"))["MAGRPO, QLoRA"][5] == "8"


def test_the_fit_search_counts_every_shape_by_hand_and_runs_the_tiny_one(smoke, bench):
    fit = rows(section(smoke[1], "Largest base that fits"))
    assert list(fit) == ["tiny", *bench.FIT]
    for shape, row in fit.items():
        assert row[1] == f"{qwen2_parameters(*bench.SHAPES[shape]):,}"
    assert fit["1.5B"][1] == "1,543,714,304"  # Qwen2-1.5B's published count
    assert fit["tiny"][3] == "fits" and all(fit[s][3] == "not tried here (needs CUDA)" for s in bench.FIT)
    assert "**tiny**" in section(smoke[1], "Largest base that fits")


def test_what_could_not_run_is_listed_with_its_reason(smoke):
    missing = section(smoke[1], "Could not run")
    assert (
        "- largest base that fits: 1.5B, 3B, 7B, 14B, 32B, 72B counted on the meta device only: needs CUDA" in missing
    )
    if importlib.util.find_spec("vllm") is None:
        assert "- vLLM engine tokens/s: vllm is not installed" in missing
    else:
        assert "- vLLM engine tokens/s: left out on the CPU" in missing
    if "## QLoRA 4-bit" in smoke[1]:  # bitsandbytes imports (its CPU kernels run the tiny shape)
        assert importlib.util.find_spec("bitsandbytes") is not None
        steps = rows(section(smoke[1], "QLoRA 4-bit"))
        assert 0 < float(steps["MAGRPO, QLoRA"][4]) <= 64
    else:
        assert "- QLoRA 4-bit step: bitsandbytes does not import" in missing
    assert "failed" not in missing


GIB = 2**30


@pytest.mark.parametrize(
    "free, fails_at, error, tried, results, largest",
    [
        # 40 GiB free, out of memory at 7B: the search stops there
        (40 * GIB, "7B", "oom", 3, ["fits", "fits", "out of memory", "not tried", "not tried", "not tried"], "3B"),
        # 20 GiB free: 14B's 27.5 GiB of bf16 weights are predicted not to fit, and it is not allocated
        (20 * GIB, None, None, 3, ["fits", "fits", "fits", "predicted not to fit", "not tried", "not tried"], "7B"),
        # another failure ends the search too, and is listed
        (40 * GIB, "3B", "bug", 2, ["fits", "failed", "not tried", "not tried", "not tried", "not tried"], "1.5B"),
    ],
    ids=["out-of-memory-at-7B", "predicted-at-14B", "failure-at-3B"],
)
def test_the_fit_search_stops_at_the_first_base_that_does_not_fit(
    bench, monkeypatch, tmp_path, free, fails_at, error, tried, results, largest
):
    stepped = []

    def step(ctx, algo, base, steps):
        shape = Path(base.name).name
        stepped.append(shape)
        if shape == fails_at:
            raise (
                torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
                if error == "oom"
                else ValueError("a bug")
            )
        return {"seconds": 1.0, "peak": 1.0 * GIB}

    monkeypatch.setattr(bench, "algo_step", step)
    monkeypatch.setattr(bench, "free_bytes", lambda ctx: free)
    monkeypatch.setattr(bench, "base_folder", lambda shape, root: str(Path(root) / shape))
    ctx = bench.Context(
        shape="1.5B",
        device="cuda",
        dtype="bfloat16",
        samples=8,
        new_tokens=128,
        repeats=1,
        problems=8,
        fit_shapes=bench.FIT,
        fit_run=bench.FIT,
        workdir=str(tmp_path),
    )
    bench.part_fit(ctx)
    fit = rows("\n".join(ctx.sections["Largest base that fits"]))
    assert [re.split(r" \(|:", fit[s][3])[0] for s in bench.FIT] == results
    assert stepped == list(bench.FIT[:tried])
    assert f"**{largest}**" in ctx.sections["Largest base that fits"][0]
    assert [part for part, _ in ctx.missing] == (["largest base that fits"] if error == "bug" else [])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_without_cuda_the_script_and_the_shell_refuse_in_one_line(bench, capsys, tmp_path):
    assert bench.main(["--out", str(tmp_path / "r.md")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: no CUDA device here") and "--cpu-smoke" in err[0]
    assert not (tmp_path / "r.md").exists()
    shell = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--out", str(tmp_path / "r.md")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
        timeout=120,
    )
    assert shell.returncode == 2 and shell.stderr.startswith("error: torch ") and "--cpu-smoke" in shell.stderr
    assert len(shell.stderr.strip().splitlines()) == 1


def test_the_shell_refuses_an_unknown_option_in_one_line():
    shell = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--fast"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert shell.returncode == 2
    assert shell.stderr == "error: unknown option --fast; valid: --out REPORT.md, --quick, --cpu-smoke\n"


def test_the_tokenizer_encodes_a_random_models_text_again_to_about_its_length(bench):
    """A random model samples ids across the whole vocabulary, mostly padding tokens: a later turn encodes the
    earlier responses again from their text, which must be about as many tokens as were sampled (each padding
    token one; the BPE's own tokens about one each), or every multi-turn prompt at a real shape grows ~10x."""
    vocab = 12_000
    tokenizer = bench.make_tokenizer(vocab)
    assert len(tokenizer) == vocab
    generator = torch.Generator().manual_seed(0)
    padding = torch.randint(8192, vocab, (200,), generator=generator).tolist()
    assert tokenizer(tokenizer.decode(padding))["input_ids"] == padding
    sampled = torch.randint(3, vocab, (400,), generator=generator).tolist()
    again = tokenizer(tokenizer.decode(sampled))["input_ids"]
    assert len(sampled) * 0.8 <= len(again) <= len(sampled) * 1.2, len(again)
