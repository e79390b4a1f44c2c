#!/usr/bin/env bash
# On a GPU machine (one GPU and 16 cores, say; no network needed): the board's full-track MORCA IQL runs, whose
# updates cost 20x the MLP algorithms' on a CPU, trained on the GPU, 14 at a time, played on the cores.
# Prepared and dry-run on a CPU, not yet run on a GPU. Here first: `bash leaderboard/gpu_wheels.sh`; then, there, in
# a copy of this checkout with .whl/ (its Python 3.12 and torch), `OUT=<folder> bash leaderboard/gpu_sweep.sh`
# (with this project's device tool: run(command="bash leaderboard/gpu_sweep.sh", carry=[".whl"], timeout_s=600)).
# Unpack what comes back here, while no board runs: `tar -xf <OUT>/runs.tar -C leaderboard/tiny` (finished runs
# only, each whole; a run already here is never rerun there: the records travel with the checkout).
# SMOKE=1: install, imports and one 20-update IQL run on the GPU (about 2 min), to check the machine and that the
# wheels cover its image before a sweep. BUDGET_S: the seconds the call may take (default 570).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
exec > >(tee "$OUT/log") 2>&1
start=$(date +%s)
PY=${PY:-python3} DEVICE=${DEVICE:-cuda}   # PY=.venv/bin/python DEVICE=cpu SMOKE=1: a dry run on a CPU machine
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
"$PY" -c "import torch, morca_env, agents, d3rlpy, minari, sb3_contrib; print('imports ok; cuda:', torch.cuda.is_available() and torch.cuda.get_device_name())" || exit 1
BOARD="--out leaderboard/tiny --updates 8000 --online-episodes 192 --curve-points 4"
IQL=("IQL (MORCA)" "IQL offline-to-online" "IQL online (scratch)")
if [ "${SMOKE:-0}" = 1 ]; then
  export MINARI_DATASETS_PATH=/tmp/minari_smoke
  "$PY" -m morca_env.commands.collect morca/tiny/anchored-v2 --episodes 8 --workers 4 || exit 1
  "$PY" -m agents.commands.leaderboard --out /tmp/smoke --only offline --datasets anchored --methods "IQL (MORCA)" \
    --tracks full --seeds 1 --episodes 8 --updates 20 --curve-points 0 --pair-step 40 --device "$DEVICE" --workers 1
  ls /tmp/smoke/runs/IQL*.json >/dev/null || { echo "smoke FAILED: no run file"; exit 1; }
  head -c 400 /tmp/smoke/runs/IQL*.json
  echo "smoke done in $(( $(date +%s) - start )) s"
  exit 0
fi
export MINARI_DATASETS_PATH=/tmp/minari
"$PY" -m morca_env.commands.collect morca/tiny/anchored-v2 --episodes 400 --workers 6 &
"$PY" -m morca_env.commands.collect morca/tiny/random-v0 --episodes 400 --workers 8 &
wait
echo "datasets in $(( $(date +%s) - start )) s"
# the call's 600 s, less what setup took and half a minute to pack: the runs not finished by then are lost (a later
# sweep or session runs them); KILL, since the board waits for its runs in flight on any gentler signal (its workers
# end with it; each finished run's file is already whole)
left=$(( ${BUDGET_S:-570} - ($(date +%s) - start) - 30 ))
if [ "$left" -gt 120 ]; then
  timeout -s KILL "$left" "$PY" -m agents.commands.leaderboard $BOARD --methods "${IQL[@]}" --tracks full \
    --device "$DEVICE" --workers "${WORKERS:-14}"   # the scalars track's IQL runs cost minutes on a CPU: left to it
  echo "board stopped (rc $?, 137: the time limit) at $(( $(date +%s) - start )) s"
else
  echo "no time left for the board after the datasets ($left s)"
fi
# finished runs only: not a file a killed writer left before its rename (".name.json.XXXX.tmp.json")
tar -cf "$OUT/runs.tar" --exclude='.*' -C leaderboard/tiny runs && tar -tf "$OUT/runs.tar" | wc -l
