#!/usr/bin/env bash
# The tiny CPU recipe end to end: prepare -> convert -> Ray head -> ray job submit train.py.
# Starts its own Ray head on 127.0.0.1 (ports below) and stops only that head, by its PID.
# Ray 2.60 turns token authentication on by default; on this private, loopback-only head we
# disable it for both `ray start` and `ray job submit` (RAY_AUTH_MODE=disabled). On a shared
# cluster keep token mode instead and export the token for the submit (see docs/en/runtime.md).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
WORK="${WORK:-$REPO/runs/tiny}"
MODEL_DIR="$WORK/model"; REF_DIR="$WORK/ref"; DATA_DIR="$WORK/data"; OUTPUT_DIR="$WORK/out"
RAY_PORT="${RAY_PORT:-6390}"; DASHBOARD_PORT="${DASHBOARD_PORT:-8275}"
export RAY_AUTH_MODE=disabled

python3 "$REPO/tools/tiny/prepare.py" --model-dir "$MODEL_DIR" --data-dir "$DATA_DIR"
python3 "$REPO/tools/convert_hf_to_torch_dist.py" --backend embedded --hf-checkpoint "$MODEL_DIR" --save "$REF_DIR"

ray start --head --block --node-ip-address 127.0.0.1 --port "$RAY_PORT" \
  --dashboard-host 127.0.0.1 --dashboard-port "$DASHBOARD_PORT" --num-cpus 2 --num-gpus 0 &
RAY_PID=$!
trap 'kill "$RAY_PID" 2>/dev/null; wait "$RAY_PID" 2>/dev/null || true' EXIT
for _ in $(seq 60); do
  curl -sf "http://127.0.0.1:$DASHBOARD_PORT/api/version" >/dev/null && break
  sleep 1
done

mapfile -t TRAIN_ARGS < <(MODEL_DIR="$MODEL_DIR" REF_DIR="$REF_DIR" DATA_DIR="$DATA_DIR" OUTPUT_DIR="$OUTPUT_DIR" \
  python3 -c 'import os, sys, yaml; [print(os.path.expandvars(a)) for a in yaml.safe_load(open(sys.argv[1]))["train_args"]]' \
  "$REPO/tools/tiny/TRAIN_ARGS.yaml")
rm -rf "$OUTPUT_DIR"
ray job submit --address "http://127.0.0.1:$DASHBOARD_PORT" \
  --runtime-env-json "{\"env_vars\": {\"PYTHONPATH\": \"$REPO\", \"RAY_AUTH_MODE\": \"disabled\"}}" \
  -- python3 "$REPO/train.py" "${TRAIN_ARGS[@]}"
python3 - "$OUTPUT_DIR/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
curve = [(r["step"], r["eval/held_out"]) for r in rows if "eval/held_out" in r]
print("held-out reward by step:", curve)
print(f"rise: {curve[-1][1] - curve[0][1]:+.3f}")
PY
