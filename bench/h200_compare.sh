#!/usr/bin/env bash
# pathprobe compare on a GPU box: bench/h200_compare.yaml (Llama-3-8B architecture, bf16,
# random weights, CUDA graphs; every gateway mode + nginx; stream; concurrency 1,8,32).
#
#   bench/h200_compare.sh RESULT_DIR
#
# Environment (all optional):
#   PATHPROBE_SRC     folder holding an importable pathprobe package (default: bench/pkgtree.sh of this checkout)
#   WHEELS            folder of wheels to install with --target into SITE first (missing packages)
#   SITE              where WHEELS go (default /tmp/site); put on PYTHONPATH
#   NGINX_BIN_DIR     folder with an `nginx` to put first on PATH (nginx is skipped when none is found)
#   PYTHON            interpreter (default python3)
#   COMPARE_CONFIG    the compare YAML (default bench/h200_compare.yaml; bench/h200_compare_procs.yaml: c=32, 4 load processes)
#   COMPARE_TIMEOUT_S kill compare after this many seconds (default 560)
#   PATHPROBE_DURATION_S / PATHPROBE_WARMUP_S / PATHPROBE_ROUNDS   override the YAML's load settings
# RESULT_DIR receives report.{json,md,html}, compare.log, env.txt and two tarballs
# (bundle.tar.gz: logs, slowest traces, per-run summaries; records.tar.gz: every request record).
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
RES=${1:?usage: bench/h200_compare.sh RESULT_DIR}
mkdir -p "$RES"
PY=${PYTHON:-python3}
SRC=${PATHPROBE_SRC:-$("$ROOT/bench/pkgtree.sh" /tmp/pathprobe-tree)}
SRC=$(cd "$SRC" && pwd)
SITE=${SITE:-/tmp/site}
if [ -n "${WHEELS:-}" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl || exit 3
  export PYTHONPATH="$SRC:$SITE"
else
  export PYTHONPATH="$SRC${PYTHONPATH:+:$PYTHONPATH}"
fi
if [ -n "${NGINX_BIN_DIR:-}" ]; then export PATH="$(cd "$NGINX_BIN_DIR" && pwd):$PATH"; fi
export PYTHONUNBUFFERED=1
WORK=${COMPARE_WORK:-/tmp/pathprobe-compare-h200}
rm -rf "$WORK"; export PATHPROBE_COMPARE_OUT="$WORK"

{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1
  echo "cpu: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
  echo "kernel: $(uname -r)"
  $PY - <<'PY'
import importlib.metadata as md, platform
print("python", platform.python_version())
for n in ("torch", "transformers", "tokenizers", "grpcio", "protobuf", "aiohttp", "uvloop", "locust", "gevent",
          "pydantic", "opentelemetry-sdk", "numpy", "scipy", "matplotlib", "hpack", "orjson"):
    try:
        print(n, md.version(n))
    except Exception as exc:  # noqa: BLE001
        print(n, "MISSING", exc)
import torch
print("cuda", torch.version.cuda, "available", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
PY
  echo "nginx: $(command -v nginx || echo none) $(nginx -v 2>&1)"
} 2>&1 | tee "$RES/env.txt"

t0=$(date +%s)
timeout -s TERM "${COMPARE_TIMEOUT_S:-560}" $PY -m pathprobe compare "${COMPARE_CONFIG:-$ROOT/bench/h200_compare.yaml}" 2>&1 | tee "$RES/compare.log"
rc=$?
echo "compare exit $rc after $(( $(date +%s) - t0 )) s" | tee -a "$RES/compare.log"

cp "$WORK"/report.json "$WORK"/report.md "$WORK"/report.html "$RES"/ 2>/dev/null
(cd "$WORK" && tar -czf "$RES/bundle.tar.gz" --exclude='records.jsonl' --exclude='traces/*.jsonl' \
   --exclude='traces/client' --exclude='*.hdr' . 2>/dev/null)
(cd "$WORK" && find runs -name records.jsonl | tar -czf "$RES/records.tar.gz" -T - 2>/dev/null)
ls -la "$RES"
exit $rc
