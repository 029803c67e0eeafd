#!/usr/bin/env bash
# CoLLM's Table 1 for the untrained embedded team: the four prompt-based baselines (single,
# parallel, pipeline, discussion) on writing (TLDR-style), coding (CoopHumanEval-style, HumanEval
# problems by default) and Minecraft HouseBuild, one table under $OUT (default docs/comparison.csv/.md).
#   bash benchmarks/comparison.sh [OUT_CSV] [MAX_TASKS] [MINECRAFT_TASKS]
# Every run: the eval split's first MAX_TASKS tasks (default 4; Minecraft MINECRAFT_TASKS, default 2,
# as its 4-turn episodes cost about 8 writing episodes each), one episode each, seeded; the
# roles' own response lengths (writing 64/128, coding 256, minecraft 128 here); MAGRPO's config
# (sampling: temperature 0.7, top-p 0.9). Time is seconds per episode on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-docs/comparison.csv}
N=${2:-4}
M=${3:-2}
PY=${PYTHON:-.venv/bin/python}
common=(--num_samples 1 --k 1 --max_tasks "$N" --tasks_per_batch "$N" --table "$OUT" --model.agents null)
for baseline in single parallel pipeline discussion; do
  $PY -m collab.evaluate --algo magrpo --baseline "$baseline" --task TLDR --data.env writing "${common[@]}"
  $PY -m collab.evaluate --algo magrpo --baseline "$baseline" --task HumanEval --data.env coding "${common[@]}"
  $PY -m collab.evaluate --algo magrpo --baseline "$baseline" --task HouseBuild --data.env minecraft \
    --data.env_options '{max_new_tokens: 128}' "${common[@]}" --max_tasks "$M" --tasks_per_batch "$M"
done
cat "${OUT%.csv}.md"
