# shellcheck shell=bash
# Sourced by tools/run_gpu_loop.sh and tools/run_gpu_mfu_loop.sh (from the checkout root, with
# OUT_DIR set): installs the wheel set carried in .whl/ (tools/build_device_wheels.py) into
# /tmp/site once, puts it first on PYTHONPATH and PATH, and defines `log`. Nothing is fetched.
if compgen -G ".whl/*.whl" >/dev/null && [[ ! -d /tmp/site/ray ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "installing the carried wheels failed" >&2; exit 3; }
fi
if [[ -d /tmp/site ]]; then
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:${PYTHONPATH}}" PATH="/tmp/site/bin:$PATH"
  export MEGATRON_PATH=/tmp/site  # experiment.sh puts it on the job's PYTHONPATH (runtime env)
fi
export PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
log() { printf '[%s] %s\n' "$(date -u +%H:%M:%S)" "$*" | tee -a "$OUT_DIR/steps.log"; }
