#!/usr/bin/env bash
# Call C: the 3.2B loop with the phase timeline (#26), 3 rollouts of ~500-token prompts.
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
timeout "${LIMIT:-540}" bash tools/run_gpu_mfu_loop.sh 500 3 > "$OUT/mfu.log" 2>&1
echo "mfu rc=$?" | tee -a "$OUT/rc"
tail -40 "$OUT/mfu.log"
