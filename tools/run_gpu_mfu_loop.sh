#!/usr/bin/env bash
# Trainer MFU and weight-sync share inside the GPU loop for a 3.2 B dense model on one GPU:
# the tiny-gpu experiment rendered by the lab, with two hand edits a user could make:
#   - MODEL_SPEC points at bench/shapes/dense-3b-tinyvocab.sh (llama3.2-3b's body: 28 layers,
#     hidden 3072, FFN 8192, 24/8 heads; the tiny character vocabulary of 14 tokens);
#   - prepare is replaced by tools/tiny/prepare.py with --prompt-digits (long prompts, so the
#     trainer's packs are full: 32 prompts x 8 samples x ~PROMPT_DIGITS tokens per rollout).
# Then convert -> check -> ray start -> train (ROLLOUTS rollouts, no evaluation, no checkpoint).
#
#   bash tools/run_gpu_mfu_loop.sh [PROMPT_DIGITS=500] [ROLLOUTS=5]
#   PROFILE_CALL=2 bash tools/run_gpu_mfu_loop.sh 500 4   # + torch.profiler of the 2nd train call
#                                                          #   (slime/profiling.py; tables in profile/)
#
# Same environment as tools/run_gpu_loop.sh (carried wheels in .whl/, its own Ray head on
# 127.0.0.1, stopped at the end). Logs and metrics go to runs/gpu-mfu/; with $OUT set, packed there
# as gpu-mfu.tgz with mfu_summary.json beside it.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
DIGITS=${1:-500}
ROLLOUTS=${2:-5}
OUT_DIR=runs/gpu-mfu
SUMMARY=mfu_summary.json
# shellcheck source=tools/gpu_env.sh
source tools/gpu_env.sh
if [[ -n "${PROFILE_CALL:-}" ]]; then  # the trainer actors inherit it from `ray start` below
  export SLIME_PROFILE_DIR="$PWD/$OUT_DIR/profile" SLIME_PROFILE_CALL="$PROFILE_CALL"
fi

WORK=runs/tiny-gpu
SPEC=bench/shapes/dense-3b-tinyvocab.sh
rm -rf "$WORK" experiment.sh experiment.json .slime-lab.*
log "render"
PYTHONPATH="$PWD:${PYTHONPATH:-}" python3 -m lab.web.cli render --model tiny-gpu --set "task.num_rollout=$ROLLOUTS" \
  --set paths.save_interval=100000 --set evaluation.enabled=false --set resources.max_tokens_per_gpu=8192 -o . || exit 4
sed -i "s|^MODEL_SPEC=.*|MODEL_SPEC=\"\${SLIME_ROOT}/\"'$SPEC'|" experiment.sh
cp experiment.sh "$OUT_DIR/experiment.sh"
log "prepare (3.2 B, bf16, initialised on the GPU; prompts of $DIGITS digits)"
PYTHONPATH="$PWD:${PYTHONPATH:-}" python3 tools/tiny/prepare.py --model-spec "$SPEC" --model-dir "$WORK/model" \
  --data-dir "$WORK/data" --prompt-digits "$DIGITS" --device cuda --dtype bfloat16 > "$OUT_DIR/prepare.log" 2>&1 \
  || { tail -30 "$OUT_DIR/prepare.log"; exit 5; }
for step in convert check; do
  log "$step"; bash experiment.sh "$step" > "$OUT_DIR/$step.log" 2>&1 || { tail -40 "$OUT_DIR/$step.log"; exit 5; }
done
log "ray start"
ray_start --node-ip-address 127.0.0.1 --port 6391 --dashboard-host 127.0.0.1 --dashboard-port 8266 \
  --num-gpus 1 --num-cpus 8 > "$OUT_DIR/ray_start.log" 2>&1 || { cat "$OUT_DIR/ray_start.log"; exit 6; }
RAY_STARTED=1
export RAY_DASHBOARD=http://127.0.0.1:8266
for _ in $(seq 60); do curl -sf "$RAY_DASHBOARD/api/version" >/dev/null && break; sleep 1; done
log "train ($ROLLOUTS rollouts)"
bash experiment.sh train > "$OUT_DIR/train.log" 2>&1 || tail -60 "$OUT_DIR/train.log"
cp "$WORK/out/metrics.jsonl" "$OUT_DIR/metrics.jsonl" 2>/dev/null
log "summary"
python3 tools/gpu_loop_summary.py /dev/null "$OUT_DIR/metrics.jsonl" | tee "$OUT_DIR/mfu_summary.json"
