# shellcheck shell=bash
# Sourced by tools/run_gpu_loop.sh and tools/run_gpu_mfu_loop.sh from the checkout root, with
# OUT_DIR (runs/NAME, emptied here) and SUMMARY (a file in it) set: on exit the Ray head the script
# started is stopped (RAY_STARTED=1: its own process group only, so heads of other runs beside it
# live on) and, where $OUT is set (the GPU machine's return folder),
# OUT_DIR is packed there as NAME.tgz with SUMMARY beside it. Installs the wheel set carried in
# .whl/ (tools/build_device_wheels.py) into /tmp/site once, puts it first on PYTHONPATH and PATH,
# and defines `log`. Nothing is fetched.
rm -rf "$OUT_DIR"
mkdir -p "$OUT_DIR"
RAY_STARTED=0
# The head's daemons keep the process group of `setsid ray start` (ray_start below); `ray stop`
# would stop every Ray on the machine, the GPU suite's parts running beside this script included.
RAY_TEMP="/tmp/ray-$(basename "$OUT_DIR")"
ray_start() { setsid ray start --head --temp-dir "$RAY_TEMP" --disable-usage-stats "$@"; }
ray_group_stop() {
  local pid pgid
  pid=$(pgrep -f -- "--log_dir=$RAY_TEMP" | head -1)
  [[ -n "$pid" ]] || return 0
  pgid=$(ps -o pgid= -p "$pid" | tr -d ' ')
  [[ -n "$pgid" ]] || return 0
  kill -TERM -- "-$pgid" 2>/dev/null
  sleep 3
  kill -KILL -- "-$pgid" 2>/dev/null
  return 0
}
finish() {
  if (( RAY_STARTED )); then ray_group_stop; fi
  if [[ -n "${OUT:-}" ]]; then
    tar czf "$OUT/$(basename "$OUT_DIR").tgz" -C "$(dirname "$OUT_DIR")" "$(basename "$OUT_DIR")"
    cp "$OUT_DIR/$SUMMARY" "$OUT/" 2>/dev/null || true
  fi
}
trap finish EXIT
if compgen -G ".whl/*.whl" >/dev/null && [[ ! -d /tmp/site/ray ]]; then
  bash tools/install_wheels.sh /tmp/site .whl/*.whl || { echo "installing the carried wheels failed" >&2; exit 3; }
fi
if [[ -d /tmp/site ]]; then
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:${PYTHONPATH}}" PATH="/tmp/site/bin:$PATH"
  export MEGATRON_PATH=/tmp/site  # experiment.sh puts it on the job's PYTHONPATH (runtime env)
fi
export PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
log() { printf '[%s] %s\n' "$(date -u +%H:%M:%S)" "$*" | tee -a "$OUT_DIR/steps.log"; }
