#!/usr/bin/env bash
# Run the GPU tests (pytest -m gpu tests/gpu) and, with --bench, the Megatron throughput benchmark,
# on a machine with an NVIDIA GPU. Wheels carried in .whl/ (megatron-core for Python 3.12, see
# docs/en/megatron.md) are installed into /tmp/site first; nothing is fetched from a registry.
#
#   tools/run_gpu_tests.sh                                  # tests only (all parts: > 10 min)
#   tools/run_gpu_tests.sh --list                           # the suite's parts (tools/gpu_parts.py)
#   tools/run_gpu_tests.sh --part 2                         # one part (< 8 min on one H200)
#   tools/run_gpu_tests.sh --bench llama3.2-3b,qwen2.5-3b   # tests, then the benchmark shapes
#   tools/run_gpu_tests.sh --bench-only llama3.2-3b -- --seq-len 8192
#
# Logs and results go to $OUT (the GPU machine's return folder) or runs/gpu-tests/. A part also
# writes its JSON summary (gpu_part_N.json: every test's outcome and seconds) there and to
# bench/results/; --dry-run prints the part's pytest command and runs nothing.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

BENCH="" TESTS=1 EXTRA=() PART="" DRY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --list) python3 tools/gpu_parts.py list; exit $? ;;
    --part) [ $# -ge 2 ] || { echo "--part needs a number (see --list)" >&2; exit 2; }
            PART="$2"; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    --bench) BENCH="$2"; shift 2 ;;
    --bench-only) BENCH="$2"; TESTS=0; shift 2 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

PART_ARGS=()
if [ -n "$PART" ]; then
  part_text=$(python3 tools/gpu_parts.py args "$PART") || exit 2
  mapfile -t PART_ARGS <<<"$part_text"
fi
if [ "$DRY" = 1 ]; then
  if [ -n "$PART" ]; then printf '%q ' python3 -m pytest -m gpu "${PART_ARGS[@]}"; echo; else echo "python3 -m pytest -m gpu tests/gpu"; fi
  exit 0
fi

OUT_DIR="${OUT:-runs/gpu-tests}"
mkdir -p "$OUT_DIR"
# .whl/*.whl, or the call folders .whl/call*/ of a set split over several device calls
# (tools/build_device_wheels.py; earlier calls' folders stay on a warm machine and install again)
shopt -s nullglob
WHEELS=(.whl/*.whl .whl/call*/*.whl)
shopt -u nullglob
# A wheel already installed by an earlier call or a part running beside this one is not installed
# again: reinstalling under a running process would swap its files mid-import.
STAMP=/tmp/site/.slime-wheels
NEW=()
for w in "${WHEELS[@]}"; do
  grep -qxF "$(basename "$w")" "$STAMP" 2>/dev/null || NEW+=("$w")
done
if [ ${#NEW[@]} -gt 0 ]; then
  bash tools/install_wheels.sh /tmp/site "${NEW[@]}" || { echo "installing the carried wheels failed" >&2; exit 3; }
  for w in "${NEW[@]}"; do basename "$w"; done >>"$STAMP"
fi
if [ -d /tmp/site ]; then
  export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 SLIME_GPU_TEST_OUT="$OUT_DIR"
export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}"

{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c 'import sys, torch, transformers, megatron.core as m; print("python", sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__, "megatron-core", m.__version__)'
} 2>&1 | tee "$OUT_DIR/environment.txt"

rc=0
if [ "$TESTS" = 1 ] && [ -n "$PART" ]; then
  python3 -m pytest -m gpu "${PART_ARGS[@]}" -v -s -p no:cacheprovider --durations=20 \
    --junitxml="$OUT_DIR/gpu_part_$PART.xml" 2>&1 | tee "$OUT_DIR/gpu_part_$PART.log"
  rc=${PIPESTATUS[0]}
  mkdir -p bench/results
  python3 tools/gpu_parts.py summary "$PART" "$OUT_DIR/gpu_part_$PART.xml" "$OUT_DIR/gpu_part_$PART.json" "$rc" \
    && cp "$OUT_DIR/gpu_part_$PART.json" "bench/results/gpu_part_$PART.json"
elif [ "$TESTS" = 1 ]; then
  python3 -m pytest -m gpu tests/gpu -v -s -p no:cacheprovider --durations=10 2>&1 | tee "$OUT_DIR/gpu_tests.log"
  rc=${PIPESTATUS[0]}
fi

if [ -n "$BENCH" ]; then
  IFS=',' read -r -a shapes <<<"$BENCH"
  for shape in "${shapes[@]}"; do
    echo "== bench_megatron.py --shape $shape ${EXTRA[*]}" | tee -a "$OUT_DIR/bench.log"
    python3 bench/bench_megatron.py --shape "$shape" "${EXTRA[@]}" >"$OUT_DIR/bench_one.log" 2>&1
    brc=$?
    grep -v -i "warn" "$OUT_DIR/bench_one.log" | tail -n 15 >>"$OUT_DIR/bench.log"
    grep '^{' "$OUT_DIR/bench_one.log" >>"$OUT_DIR/bench_results.jsonl"
    [ $brc -ne 0 ] && echo "bench $shape exited $brc" | tee -a "$OUT_DIR/bench.log"
  done
  rm -f "$OUT_DIR/bench_one.log"
fi
exit "$rc"
