#!/usr/bin/env bash
# The payload sweep of bench/payload.yaml, unary then streamed, with the load average beside each run.
set -euo pipefail
PY=${PYTHON:-.venv/bin/python}
OUT=${OUT:-out/payload}
for mode in unary stream; do
  flag=$([ "$mode" = stream ] && echo --stream || echo --no-stream)
  echo "load average before $mode: $(cut -d' ' -f1-3 /proc/loadavg)"
  "$PY" -m pathprobe compare bench/payload.yaml "$flag" --out "$OUT-$mode"
  echo "load average after $mode: $(cut -d' ' -f1-3 /proc/loadavg)"
done
