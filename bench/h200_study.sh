#!/usr/bin/env bash
# The latency study on a GPU box (bench/gpu_study.py) from an uninstalled checkout.
#
#   bench/h200_study.sh RESULT_DIR PART [gpu_study.py options...]     PART: table|streams|seqlen|ablate|all
#
# Environment (optional): WHEELS (folder of wheels for missing packages, installed with --target
# into SITE, default /tmp/site), PYTHON (default python3), PATHPROBE_CACHE (preset folders;
# default /tmp/pathprobe-cache). RESULT_DIR gets PART.json, env.txt and the run's log.
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
RES=${1:?usage: bench/h200_study.sh RESULT_DIR PART [options]}
PART=${2:?usage: bench/h200_study.sh RESULT_DIR PART [options]}
shift 2
mkdir -p "$RES"
PY=${PYTHON:-python3}
SRC=$("$ROOT/bench/pkgtree.sh" /tmp/pathprobe-tree)
SITE=${SITE:-/tmp/site}
if [ -n "${WHEELS:-}" ] && [ ! -e "$SITE/.installed" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl || exit 3
  touch "$SITE/.installed"
fi
export PYTHONPATH="$SRC:$SITE"
export PYTHONUNBUFFERED=1
export PATHPROBE_CACHE=${PATHPROBE_CACHE:-/tmp/pathprobe-cache}
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1
  echo "cpu: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
  echo "kernel: $(uname -r)"
} > "$RES/env-$PART.txt" 2>&1
$PY "$ROOT/bench/gpu_study.py" "$PART" --out "$RES" "$@" 2>&1 | tee "$RES/log-$PART.txt"
