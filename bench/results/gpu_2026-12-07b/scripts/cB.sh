#!/usr/bin/env bash
# Call B (after A on the same warm machine): the tilelang set beside the .whl set, then the Qwen3.5
# family recipe and GPU part 4 (MTP, critic) side by side, each pytest with its own basetemp.
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
t0=$(date +%s)
[ -d /tmp/site/ray ] || { echo "no .whl set in /tmp/site: call A did not run on this machine" | tee -a "$OUT/rc"; exit 3; }
bash tools/install_wheels.sh /tmp/site .gpu/tl/*.whl && for w in .gpu/tl/*.whl; do basename "$w"; done >> /tmp/site/.slime-wheels
echo "install tl rc=$? $(( $(date +%s) - t0 ))s" | tee -a "$OUT/rc"
export PYTHONPATH="$PWD:/tmp/site" PATH="/tmp/site/bin:$PATH" PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
python3 -c 'import tilelang, triton; print("tilelang", tilelang.__version__, "triton", triton.__version__)' 2>&1 | tail -1 | tee -a "$OUT/rc"
L=${LIMIT:-500}
( mkdir -p "$OUT/q"; SLIME_GPU_TEST_OUT="$OUT/q" timeout "$L" python3 -m pytest -m gpu tests/gpu/test_family_recipes_gpu.py -k qwen3_5 -v -s \
    -p no:cacheprovider --basetemp /tmp/pt-q --junitxml="$OUT/q/junit.xml" > "$OUT/q.log" 2>&1
  rc=$?; echo "qwen recipe rc=$rc $(( $(date +%s) - t0 ))s" >> "$OUT/rc"
  python3 tools/gpu_parts.py summary 7 "$OUT/q/junit.xml" "$OUT/q/summary.json" "$rc" ) &
sleep 5
( mkdir -p "$OUT/p4"; OUT="$OUT/p4" timeout "$L" bash tools/run_gpu_tests.sh --part 4 > "$OUT/p4.log" 2>&1
  echo "part4 rc=$? $(( $(date +%s) - t0 ))s" >> "$OUT/rc" ) &
wait
cat "$OUT/rc"
grep -hE "PASSED|FAILED|ERROR|passed|failed|\[family-loop\]" "$OUT/q.log" "$OUT/p4.log" | tail -30
cp bench/results/gpu_part_4.json "$OUT/p4/" 2>/dev/null
cd "$OUT" && tar czf results.tgz q p4 q.log p4.log rc gpu.txt && rm -rf q p4
