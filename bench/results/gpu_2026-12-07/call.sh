#!/usr/bin/env bash
# Device call A: wheels into /tmp/site once, then the five family recipes of parts 6 and 7 (all but
# Qwen3.5) in five pytest processes side by side (one recipe each), each with its own Ray head.
set -u
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && for w in .whl/*.whl; do basename "$w"; done >> /tmp/site/.slime-wheels
echo "install rc=$? $(( $(date +%s) - t0 ))s" | tee -a "$OUT/rc"
export PYTHONPATH="$PWD:/tmp/site" PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
stream() {  # name, part, -k expression
  mkdir -p "$OUT/$1"
  SLIME_GPU_TEST_OUT="$OUT/$1" timeout 300 python3 -m pytest -m gpu tests/gpu/test_family_recipes_gpu.py -k "$3" -v -s \
    -p no:cacheprovider --basetemp "/tmp/pt-$1" --junitxml="$OUT/$1/junit.xml" > "$OUT/$1.log" 2>&1
  rc=$?; echo "$1 rc=$rc $(( $(date +%s) - t0 ))s" >> "$OUT/rc"
  python3 tools/gpu_parts.py summary "$2" "$OUT/$1/junit.xml" "$OUT/$1/summary.json" "$rc"
}
stream s1 6 "glm4 and not moe" &
sleep 3; stream s2 6 "glm4_moe and not lite" &
sleep 3; stream s3 6 "glm4_moe_lite" &
sleep 3; stream s4 7 "deepseek_v3" &
sleep 3; stream s5 7 "glm_moe_dsa" &
wait
cat "$OUT/rc"
grep -hE "PASSED|FAILED|ERROR|passed|failed" "$OUT"/s?.log | tail -20
cd "$OUT" && tar czf results.tgz s1 s2 s3 s4 s5 s?.log rc gpu.txt && rm -rf s1 s2 s3 s4 s5
