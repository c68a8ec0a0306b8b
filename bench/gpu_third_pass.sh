#!/usr/bin/env bash
# The GPU engine's third pass on a GPU box, from an uninstalled checkout, in priority order:
#
#   bench/gpu_third_pass.sh RESULT_DIR [PARTS] [SECONDS]
#
# PARTS (default decode,serve,sessions; int4 on request): decode (in process: CUDA graphs, batch 1, fused
# projections off / on, each with a profile of its decode graph), serve (`pathprobe serve` with
# compile=1 fuse=1 and a compile cache, started twice: the second start reads the first one's
# cache), sessions (serve with the dynamic KV cache, 4-turn conversations, prefix cache on / off),
# int4 (one layer: int4 quantization error against the int4 kernel's own error; needs torchao).
# A part is not started once SECONDS (default 540) have passed. WHEELS: a folder of wheels for what
# the machine lacks (installed with --target into /tmp/site). RESULT_DIR gets env.txt, log.txt and
# one JSON per run (at most 8 files). SMALL=1: decode and sessions on the CPU with the @tiny preset
# (a check of the script; serve is skipped). ORDER (default on,off): the sessions arms in the order
# they run, prefix cache on or off, repeats allowed (off,on,off,on); each writes
# sessions-<position>-prefix<1|0>.json. ARM_S (default 30): seconds of load per sessions arm.
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
RES=${1:?usage: bench/gpu_third_pass.sh RESULT_DIR [PARTS] [SECONDS]}
PARTS=${2:-decode,serve,sessions}
LIMIT=${3:-540}
ORDER=${ORDER:-on,off}
ARM_S=${ARM_S:-30}
mkdir -p "$RES"
SITE=${SITE:-/tmp/site}
if [ -n "${WHEELS:-}" ] && [ ! -e "$SITE/.installed" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl || exit 3
  touch "$SITE/.installed"
fi
export PYTHONPATH="$("$ROOT/bench/pkgtree.sh" /tmp/pathprobe-tree):$SITE"
export PYTHONUNBUFFERED=1
export PATHPROBE_CACHE=${PATHPROBE_CACHE:-/tmp/pathprobe-cache}
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "commit: $(cat "$ROOT/COMMIT" 2>/dev/null || git -C "$ROOT" rev-parse HEAD 2>/dev/null)"
  nvidia-smi --query-gpu=name,uuid,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1
  echo "cpu: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
  echo "kernel: $(uname -r)"
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} > "$RES/env.txt" 2>&1
cat "$RES/env.txt"
T0=$(date +%s)
left() { [ $(($(date +%s) - T0)) -lt "$LIMIT" ]; }
run() { echo "== $(($(date +%s) - T0)) s: $*"; "$@"; }
G="cuda_graphs=1,static_max_len=256"
X=()
if [ -n "${SMALL:-}" ]; then X=(--small); G="static_cache=1,static_max_len=256"; PARTS=${PARTS//serve/}; fi
SERVE="--max-batch-size 1 --engine-option cuda_graphs=1 --engine-option static_max_len=256"
SERVE="$SERVE --engine-option compile=1 --engine-option fuse=1 --engine-option compile_cache=/tmp/pathprobe-inductor"
{
  case ",$PARTS," in *,decode,*)
    left && run python3 "$ROOT/bench/gpu_third_pass.py" decode --options "$G" --options "$G,fuse=1" \
      --batch 1 "${X[@]}" --out "$RES/decode.json" ;;
  esac
  case ",$PARTS," in *,serve,*)
    for n in 1 2; do
      left && run python3 "$ROOT/bench/gpu_second_pass.py" serve --serve-args "$SERVE" --out "$RES/serve-compile-$n.json"
    done ;;
  esac
  case ",$PARTS," in *,sessions,*)
    i=0
    for arm in ${ORDER//,/ }; do
      i=$((i + 1))
      case $arm in on) pc=1 ;; off) pc=0 ;; *) echo "ORDER: $arm is not on or off"; continue ;; esac
      left && run python3 "$ROOT/bench/gpu_third_pass.py" sessions --prefix-cache "$pc" --seconds "$ARM_S" \
        --words 30 "${X[@]}" --out "$RES/sessions-$i-prefix$pc.json"
    done ;;
  esac
  case ",$PARTS," in *,int4,*)
    left && run python3 "$ROOT/bench/gpu_third_pass.py" int4 --out "$RES/int4.json" ;;
  esac
  echo "== $(($(date +%s) - T0)) s: done"
} 2>&1 | grep --line-buffered -v "Loading weights" | tee "$RES/log.txt"
