#!/usr/bin/env bash
# Call A: the .whl set into /tmp/site (stamped, as run_gpu_tests.sh does), then the MoE bench (#26).
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
t0=$(date +%s)
mkdir -p /tmp/site
bash tools/install_wheels.sh /tmp/site .whl/*.whl && for w in .whl/*.whl; do basename "$w"; done >> /tmp/site/.slime-wheels
echo "install rc=$? $(( $(date +%s) - t0 ))s" | tee -a "$OUT/rc"
export PYTHONPATH="$PWD:/tmp/site" PATH="/tmp/site/bin:$PATH" PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ -z "${SKIP_MOE:-}" ] && [ "${mem%%.*}" -gt 100000 ]; then
  timeout "${MOE_LIMIT:-300}" python3 bench/bench_megatron.py --shape glm4.7-flash-6l --moe-experts both \
    --json "$OUT/moe_both.json" > "$OUT/moe.log" 2>&1
  echo "moe rc=$? $(( $(date +%s) - t0 ))s" | tee -a "$OUT/rc"
  tail -25 "$OUT/moe.log"
else
  echo "GPU has ${mem} MiB: MoE bench (85 GiB peak) skipped" | tee -a "$OUT/rc"
fi
