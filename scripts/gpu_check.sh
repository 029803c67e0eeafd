#!/usr/bin/env bash
# The GPU path checked in one command, on a machine with a CUDA GPU:
#
#   bash scripts/gpu_check.sh [--out REPORT.md] [--quick] [--cpu-smoke]
#
# 1. Installs what is missing, offline-tolerantly: collab itself (pip install -e . --no-deps; where even that
#    fails, PYTHONPATH=src), collab's requirements that do not import, the optional bitsandbytes (QLoRA) and
#    vllm (the vLLM engine), and reasoning-gym (the math env's problems; --no-deps, as scripts/setup.sh). Each
#    from the wheels in $COLLAB_WHEELS when set (pip --no-index --find-links; a wheel whose requirements pip
#    cannot resolve offline is retried with --no-deps), else from the package index when it answers. torch is
#    held at the installed build (a package that needs another torch is not installed, rather than replacing the
#    CUDA build). What could not be installed is listed in the report with pip's reason; nothing here stops the
#    run. On an H200 the --quick run took about 5 minutes once installed before the presets part, and more than
#    9 minutes in all with that part at 256 tokens and 3 steps (docs/measurements.md): --quick runs it at 32
#    tokens and 2 steps; give a time limit of the device's 10 minutes.
# 2. Runs the GPU tests: pytest -m gpu (tests/policy/test_gpu.py).
# 3. Runs benchmarks/gpu_check.py (a Qwen2-1.5B-shaped team with random weights, bf16: rollout tokens/s against
#    HF generate, a MAGRPO and a MARFT-A step, QLoRA, vLLM, the largest base that fits), which writes the
#    markdown report (default gpu_check.md): device, versions, date, the set-up notes, the tests' summary,
#    every figure, and a "Could not run" list with the reasons.
# 4. Runs benchmarks/paper_shapes.py on MAGRPO's writing preset at its paper's shape (two Qwen3-1.7B agents): 3
#    optimizer steps with LoRA agents and 3 with its own full-parameter agents, appended to the report.
# 5. Runs benchmarks/fsdp_memory.py: one step of CoLLM's writing preset with full agents under --trainer.strategy fsdp
#    on every GPU found (NCCL, bfloat16; one GPU: a 1-process baseline), each process's memory appended to the report.
#
# --quick: less of each benchmark part (the presets' and fsdp's responses 32 tokens). --cpu-smoke: no GPU needed and nothing installed: the benchmark's logic
# at a tiny shape on the CPU (its figures are not measurements).
# Exit status: 0 when the GPU tests passed and every benchmark part that could run did; 1 otherwise; 2 on bad
# options, or without CUDA outside --cpu-smoke. $PYTHON picks the interpreter (default python3).
set -uo pipefail
PY=${PYTHON:-python3}
REPORT=gpu_check.md
ARGS=()
SMOKE=0
while [ $# -gt 0 ]; do
    case $1 in
        --out)
            [ $# -ge 2 ] || { echo "error: --out needs a file name (e.g. --out gpu_check.md)" >&2; exit 2; }
            REPORT=$2; shift 2 ;;
        --quick) ARGS+=(--quick); shift ;;
        --cpu-smoke|--dry-run) ARGS+=(--cpu-smoke); SMOKE=1; shift ;;
        -h|--help) sed -n '2,28p' "$0" | cut -c3-; exit 0 ;;
        *) echo "error: unknown option $1; valid: --out REPORT.md, --quick, --cpu-smoke" >&2; exit 2 ;;
    esac
done
case $REPORT in /*) ;; *) REPORT=$PWD/$REPORT ;; esac  # relative to where it was called from
case ${COLLAB_WHEELS:-/} in /*) ;; *) COLLAB_WHEELS=$PWD/$COLLAB_WHEELS ;; esac
cd "$(dirname "$0")/.." || exit 2
HERE=$(pwd -P)

if ! read -r TORCH CUDA < <("$PY" -c "import torch; print(torch.__version__, int(torch.cuda.is_available()))" 2>/dev/null)
then
    echo "error: $PY cannot import torch; install the torch build for this machine's CUDA first (docs/install.md)" >&2
    exit 2
fi
if [ $SMOKE = 0 ] && [ "$CUDA" != 1 ]; then
    echo "error: torch $TORCH sees no CUDA device here; run on a GPU machine, or pass --cpu-smoke" >&2
    exit 2
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
NOTES=$WORK/setup.md
: > "$NOTES"
note() { echo "- $*" >> "$NOTES"; echo "gpu_check: $*" >&2; }
echo "torch==$TORCH" > "$WORK/constraints.txt"
note "torch $TORCH (held at this build by every install below)"

pip_try() {  # pip_try LABEL PIP-OPTIONS... SPEC; on failure appends "LABEL: pip's last error line; " to $WORK/why
    local label=$1
    shift
    timeout 600 "$PY" -m pip install -q --disable-pip-version-check -c "$WORK/constraints.txt" "$@" > "$WORK/pip.log" 2>&1 \
        && return 0
    echo -n "$label: $(grep -E 'ERROR|[Ee]rror' "$WORK/pip.log" | tail -n 1 | cut -c1-200); " >> "$WORK/why"
    return 1
}
pip_install() {  # pip_install SPEC [--no-deps]: from $COLLAB_WHEELS when set, else (or then) from the package index
    : > "$WORK/why"
    if [ -n "${COLLAB_WHEELS:-}" ]; then
        pip_try "wheels in $COLLAB_WHEELS" --no-index --find-links "$COLLAB_WHEELS" ${2:-} "$1" && return 0
        # a carried wheel whose requirements the machine already meets, but which pip cannot resolve offline
        # against that machine's own builds (a torch with a local label, say): the wheel alone
        [ -z "${2:-}" ] && pip_try "wheels in $COLLAB_WHEELS, --no-deps" --no-index --find-links "$COLLAB_WHEELS" \
            --no-deps "$1" && return 0
    fi
    pip_try "package index" --timeout 15 --retries 1 ${2:-} "$1"
}
why() { sed 's/; $//' "$WORK/why"; }

# 1. collab itself, from this checkout; then its requirements (setup.cfg's) and the optional packages
WHERE=$("$PY" -c "import collab, os; print(os.path.realpath(os.path.dirname(collab.__file__)))" 2>/dev/null)
if [ "$WHERE" = "$HERE/src/collab" ]; then
    note "collab: imports from this checkout"
elif [ -n "$WHERE" ]; then
    export PYTHONPATH="$HERE/src${PYTHONPATH:+:$PYTHONPATH}"
    note "collab: another copy imports from $WHERE; this checkout's is used (PYTHONPATH=src)"
elif [ $SMOKE = 0 ] && "$PY" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e . \
        > "$WORK/pip.log" 2>&1; then
    note "collab: installed from this checkout (pip install -e . --no-deps)"
else
    export PYTHONPATH="$HERE/src${PYTHONPATH:+:$PYTHONPATH}"
    note "collab: not installed (pip install -e . skipped or failed); PYTHONPATH=src"
fi

REQUIREMENTS='
import configparser, re
config = configparser.ConfigParser()
config.read("setup.cfg")
for line in config["options"]["install_requires"].split("\n"):
    spec = line.strip()
    name = re.split(r"[\[<>=!~ ]", spec)[0]
    if name and name not in ("torch", "bitsandbytes"):
        print(spec, name.replace("-", "_"))
print("bitsandbytes bitsandbytes")
print("vllm vllm")
print("reasoning-gym==0.1.25 reasoning_gym --no-deps")
'
# A line's third word, --no-deps, marks a package installed without its requirements (reasoning-gym, the math
# env's problems: collab imports only its generator modules, as scripts/setup.sh installs it): such a package
# is looked for, not imported, and installed with --no-deps
found() {  # found MODULE [--no-deps]: prints its version when it is there
    if [ -n "${2:-}" ]; then
        "$PY" -c "import importlib.metadata as m, importlib.util as u; assert u.find_spec('$1'); print(m.version('$1'))" 2>/dev/null
    else
        "$PY" -c "import $1; print(getattr($1, '__version__', '?'))" 2>/dev/null
    fi
}
"$PY" -c "$REQUIREMENTS" > "$WORK/requirements"
while read -r spec module flags <&3; do
    if v=$(found "$module" $flags); then
        case $module in bitsandbytes|vllm|reasoning_gym) note "$module $v" ;; esac
    elif [ $SMOKE = 1 ]; then
        note "not installed: $spec (--cpu-smoke installs nothing)"
    elif pip_install "$spec" $flags; then
        note "installed $spec"
    else
        note "not installed: $spec: $(why)"
    fi
done 3< "$WORK/requirements"

# 2. the GPU tests
mapfile -t TESTS < <(grep -rl --include='*.py' "pytest.mark.gpu" tests | sort)
if "$PY" -c "import pytest" 2>/dev/null; then
    "$PY" -m pytest -q -m gpu -p no:cacheprovider "${TESTS[@]}" > "$WORK/pytest.log" 2>&1
    STATUS=$?
    tail -n 3 "$WORK/pytest.log" >&2
else
    echo "pytest is not installed: the GPU tests did not run" > "$WORK/pytest.log"
    STATUS=5
fi

# 3. the benchmark, which writes the report
"$PY" benchmarks/gpu_check.py --out "$REPORT" --setup "$NOTES" --tests-log "$WORK/pytest.log" --tests-status "$STATUS" \
    ${ARGS[@]+"${ARGS[@]}"}
BENCH=$?

# 4. MAGRPO's writing preset at its paper's shape (two Qwen3-1.7B agents, 4 answers of 256 tokens): 3 optimizer steps
#    with LoRA agents and 3 with its own full-parameter agents, timed by phase with the GPU's peak allocation, through
#    benchmarks/paper_shapes.py (which gpu_check.py does not import: it imports gpu_check's helpers); their "Training
#    steps" tables are appended to the report. --cpu-smoke: one step of each at a tiny shape.
if [ $SMOKE = 1 ]; then SHAPES=(--smoke --steps 1); else SHAPES=(--device cuda --run all --steps 3); fi
for A in ${ARGS[@]+"${ARGS[@]}"}; do [ "$A" = --quick ] && [ $SMOKE = 0 ] && SHAPES=(--device cuda --run all --steps 2 --max-new-tokens 32); done
printf '\n## Presets at their papers'"'"' shapes\n' >> "$REPORT"
for FT in lora full; do
    echo "gpu_check: magrpo_writing_paper with $FT agents..." >&2
    "$PY" benchmarks/paper_shapes.py --preset magrpo_writing_paper --finetune "$FT" "${SHAPES[@]}" \
        --out "$WORK/shapes_$FT.md" > /dev/null
    CODE=$?
    if [ -f "$WORK/shapes_$FT.md" ]; then
        printf '\n%s agents (exit %s):\n' "$FT" "$CODE" >> "$REPORT"
        sed -n '/^## Training steps/,/^## /p' "$WORK/shapes_$FT.md" | sed '1d;$d' >> "$REPORT"
    else
        printf '\n- %s agents: benchmarks/paper_shapes.py wrote no report (exit %s)\n' "$FT" "$CODE" >> "$REPORT"
    fi
    [ "$CODE" = 0 ] || BENCH=1
done

# 5. collab's fsdp on every GPU found: CoLLM's writing preset with full agents (two Qwen3-1.7B writers and the
#    critic's own Qwen3-1.7B base), bfloat16, one optimizer step on NCCL processes, one a GPU, through
#    benchmarks/fsdp_memory.py: each process's share of the weights, gradients and AdamW moments against the whole
#    / N and the projection, and its peak GPU memory; appended to the report. One GPU: one process, which fsdp does
#    not shard (a baseline, not a check of fsdp). --cpu-smoke: the tiny shape on 2 gloo CPU processes.
printf '\n## fsdp: CoLLM writing preset, full agents, on every GPU\n\n' >> "$REPORT"
if [ $SMOKE = 1 ]; then
    NGPU=0
    FSDP=(--smoke --devices 2 --accelerator cpu --max-new-tokens 4)
    echo "- --cpu-smoke: the tiny shape on 2 gloo CPU processes (its figures are not measurements)" >> "$REPORT"
else
    NGPU=$("$PY" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
    FSDP=(--devices "$NGPU" --accelerator gpu)
    for A in ${ARGS[@]+"${ARGS[@]}"}; do [ "$A" = --quick ] && FSDP+=(--max-new-tokens 32); done
    if [ "$NGPU" = 1 ]; then
        echo "- 1 GPU: one process, which fsdp does not shard: the figures are a 1-process baseline, not a check of fsdp" \
            >> "$REPORT"
    fi
fi
if [ $SMOKE = 0 ] && [ "$NGPU" -lt 1 ]; then
    echo "- no GPU found: the fsdp step did not run" >> "$REPORT"
    echo "gpu_check: no GPU found: the fsdp step did not run" >&2
else
    echo "gpu_check: fsdp step of collm_writing_paper with full agents on ${FSDP[*]}..." >&2
    "$PY" benchmarks/fsdp_memory.py --preset collm_writing_paper "${FSDP[@]}" --workdir "$WORK/fsdp" \
        --out "$WORK/fsdp.json" > "$WORK/fsdp.md"
    CODE=$?
    cat "$WORK/fsdp.md" >> "$REPORT"
    printf '\n(exit %s: 0 when every process held at most 1/N of the whole state + 10%%)\n' "$CODE" >> "$REPORT"
    [ "$CODE" = 0 ] || BENCH=1
fi
echo "gpu_check: report in $REPORT (GPU tests: exit $STATUS; benchmark: exit $BENCH)" >&2
[ "$STATUS" = 0 ] || exit 1
exit "$BENCH"
