"""benchmarks/fsdp_memory.py at the tiny Qwen3 shape on 2 gloo processes: each keeps half of the full team's
weights, gradients and AdamW moments (the shape's dimensions are even, so exactly half), as the projection counts
them; each backward pass gathered one agent's model whole (weights and gradients: MAGRPO's loss split per model
under fsdp), not both, as the projection counts; its resident memory recorded inside ``Lockstep.backward``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_two_processes_each_hold_half_of_the_full_teams_state(tmp_path):
    out = tmp_path / "fsdp.json"
    env = {
        **os.environ,
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
    }
    env.pop("LOCAL_RANK", None)
    command = [sys.executable, "benchmarks/fsdp_memory.py", "--smoke", "--devices", "2", "--max-new-tokens", "4"]
    command += ["--workdir", str(tmp_path / "work"), "--out", str(out)]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    projection, ranks = result["projection"], result["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and result["measured_parameters_match"]
    whole = projection["whole_state"]
    # two agents' weights, gradients and two moments, all bfloat16: 8 bytes a parameter of the team
    assert whole == 8 * projection["parameters"] and projection["held"] == whole // 2
    for r in ranks:
        assert r["optimizer_steps"] == 1 and r["whole_weights"] == 2 * projection["parameters"]
        assert r["weights"] == r["whole_weights"] // 2
        assert r["grads"] == r["weights"] and r["moments"] == 2 * r["weights"]
        assert r["state"] == projection["held"] and r["state_within_10pct"]
        # one agent's weights and its gradients (as many bytes as both agents' weights), not both agents'
        assert r["gathered"] == projection["gathered"] == r["whole_weights"]
        assert r["rss_backward"] is not None and r["rss_start"] < r["rss_backward"] <= r["peak_rss"]
    assert "| rank | weights |" in proc.stdout and "2 gloo CPU process(es)" in proc.stdout
