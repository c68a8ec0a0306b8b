#!/usr/bin/env bash
# Wheels for what a GPU box's image lacks (Python 3.12, x86-64, no package index there), downloaded
# here into DIR for bench/gpu_third_pass.sh / h200_study.sh (WHEELS=DIR): pathprobe's base, server
# and loadgen needs with their dependencies, less what the image has (torch, transformers,
# tokenizers, numpy, safetensors, sentencepiece, huggingface_hub) and less pip's own tooling; and
# torchao for quant=. About 34 MB.
#
#   bench/gpu_wheels.sh DIR
set -eu
DIR=${1:?usage: bench/gpu_wheels.sh DIR}
PY=${PYTHON:-python3}
PLAT="--only-binary=:all: --python-version 3.12 --implementation cp --platform any"
for n in 1 2014; do PLAT="$PLAT --platform manylinux${n}_x86_64"; done
for n in 17 24 27 28 31 34 35; do PLAT="$PLAT --platform manylinux_2_${n}_x86_64"; done
# shellcheck disable=SC2086
$PY -m pip download -q $PLAT -d "$DIR" \
  "grpcio==1.85.3" "grpcio-health-checking>=1.85" "grpcio-reflection>=1.85" "protobuf>=7.35" "aiohttp>=3.10" \
  "pydantic>=2.7" "typing-extensions>=4.12" "pyyaml>=6" "prometheus-client>=0.20" "opentelemetry-api>=1.30" \
  "opentelemetry-sdk>=1.30" "opentelemetry-exporter-otlp-proto-grpc>=1.30" "orjson>=3.9" "hpack>=4.0" "h2>=4.1" \
  "uvloop>=0.19" "fastapi>=0.110" "uvicorn>=0.30" "httptools>=0.6" "regex" "locust>=2.30" "hdrhistogram>=0.10" \
  "nvidia-ml-py>=12"
$PY -m pip download -q --no-deps $PLAT -d "$DIR" "torchao==0.18.0"
rm -f "$DIR"/pytest-* "$DIR"/iniconfig-* "$DIR"/pluggy-* "$DIR"/pygments-* "$DIR"/setuptools-* "$DIR"/packaging-*
ls "$DIR" | wc -l
