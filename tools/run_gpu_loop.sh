#!/usr/bin/env bash
# The GPU loop end to end on one GPU machine, through the lab's rendered experiment.sh:
# render (slime-lab, recipe tiny-gpu) -> prepare -> convert -> check -> ray start -> train
# (Megatron trainer + bf16 embedded engine colocated on the GPU, train.py on Ray) -> stop the job
# after its first checkpoint -> train again with LOAD_DIR set (resume) -> summary.
#
#   bash tools/run_gpu_loop.sh            # on the GPU machine, from the checkout root
#
# Wheels carried in .whl/ (tools/build_device_wheels.py: Ray trimmed, its small dependencies,
# megatron-core) are installed into /tmp/site first; nothing is fetched. This script starts its own
# Ray head on 127.0.0.1 (ports 6390 / 8265) for the run and, at the end, stops that head's process
# group alone, so the GPU suite's parts may run beside it (experiment.sh itself never starts a cluster).
# Logs, metrics and summary.json go to runs/gpu-loop/; where $OUT is set (the GPU machine's return
# folder, which takes few files) they are packed there as gpu-loop.tgz, with summary.json beside it.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUT_DIR=runs/gpu-loop
SUMMARY=summary.json
# shellcheck source=tools/gpu_env.sh
source tools/gpu_env.sh
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c 'import sys, torch, transformers, ray, megatron.core as m; print("python", sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__, "ray", ray.__version__, "megatron-core", m.__version__)'
} 2>&1 | tee "$OUT_DIR/environment.txt"

WORK=runs/tiny-gpu
FIRST_SAVE=$(python3 -c 'import yaml; print(yaml.safe_load(open("recipes/tiny-gpu.yaml"))["save_interval"])')
rm -rf "$WORK" experiment.sh experiment.json .slime-lab.*
log "render"; PYTHONPATH="$PWD:${PYTHONPATH:-}" python3 -m lab.web.cli render --model tiny-gpu -o . || exit 4
cp experiment.sh "$OUT_DIR/experiment.sh"
for step in prepare convert check; do
  log "$step"; bash experiment.sh "$step" > "$OUT_DIR/$step.log" 2>&1 || { tail -40 "$OUT_DIR/$step.log"; exit 5; }
done

log "ray start"
ray_start --node-ip-address 127.0.0.1 --port 6390 --dashboard-host 127.0.0.1 --dashboard-port 8265 \
  --num-gpus 1 --num-cpus 8 > "$OUT_DIR/ray_start.log" 2>&1 || { cat "$OUT_DIR/ray_start.log"; exit 6; }
RAY_STARTED=1
for _ in $(seq 60); do curl -sf http://127.0.0.1:8265/api/version >/dev/null && break; sleep 1; done
export RAY_DASHBOARD=http://127.0.0.1:8265
if ! curl -sf "$RAY_DASHBOARD/api/version" >/dev/null; then
  log "the Ray dashboard (job server) is not up: 'ray job submit' cannot work here; see ray_start.log"
  exit 8
fi

log "train (run 1; stopped after its first checkpoint)"
bash experiment.sh train > "$OUT_DIR/train1.log" 2>&1 &
TRAIN_PID=$!
for _ in $(seq 300); do
  [[ "$(cat "$WORK/ckpt/latest_checkpointed_iteration.txt" 2>/dev/null)" == "$FIRST_SAVE" ]] && break
  kill -0 "$TRAIN_PID" 2>/dev/null || break
  sleep 1
done
JOB=$(curl -sf http://127.0.0.1:8265/api/jobs/ | python3 -c 'import json,sys; print(" ".join(j["submission_id"] for j in json.load(sys.stdin) if j["status"] == "RUNNING"))')
log "checkpoint: $(cat "$WORK/ckpt/latest_checkpointed_iteration.txt" 2>/dev/null); stopping job(s) ${JOB:-none}"
for j in $JOB; do ray job stop --address "$RAY_DASHBOARD" "$j" >> "$OUT_DIR/train1.log" 2>&1; done
wait "$TRAIN_PID"
cp "$WORK/out/metrics.jsonl" "$OUT_DIR/metrics_run1.jsonl" 2>/dev/null
if [[ "$(cat "$WORK/ckpt/latest_checkpointed_iteration.txt" 2>/dev/null)" != "$FIRST_SAVE" ]]; then
  tail -80 "$OUT_DIR/train1.log"
  exit 7
fi

log "train (run 2: LOAD_DIR=SAVE_DIR, the variables block's hand edit)"
sed -i "s|^LOAD_DIR=''|LOAD_DIR=runs/tiny-gpu/ckpt|" experiment.sh
bash experiment.sh check > "$OUT_DIR/check2.log" 2>&1 || tail -20 "$OUT_DIR/check2.log"
timeout 240 bash experiment.sh train > "$OUT_DIR/train2.log" 2>&1 || tail -60 "$OUT_DIR/train2.log"
cp "$WORK/out/metrics.jsonl" "$OUT_DIR/metrics.jsonl" 2>/dev/null
log "summary"
python3 tools/gpu_loop_summary.py "$OUT_DIR/metrics_run1.jsonl" "$OUT_DIR/metrics.jsonl" | tee "$OUT_DIR/summary.json"
