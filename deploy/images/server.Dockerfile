# syntax=docker/dockerfile:1
# pathprobe model server: `pathprobe serve` (gRPC :50051, HTTP :8000), the tiny model baked in.
#   CPU:  docker build -f deploy/images/server.Dockerfile -t pathprobe-server .
#   CUDA: docker build -f deploy/images/server.Dockerfile --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 \
#           --build-arg EXTRAS=server,gpu -t pathprobe-server:cuda .
# The CUDA variant needs no CUDA base image: PyTorch's CUDA wheels carry the CUDA runtime,
# the host's NVIDIA driver comes in through the NVIDIA container toolkit (`--gpus all`,
# or `nvidia.com/gpu` on Kubernetes). Run it with `--device cuda`.
# Base pinned by digest (python:3.12-slim-bookworm); refresh with
#   docker buildx imagetools inspect python:3.12-slim-bookworm
ARG PYTHON_IMAGE=python:3.12-slim-bookworm@sha256:782412e85d0f0984994c290652577d4018aff08145c85b262bb63dc0c7522254

FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY proto ./proto
COPY core ./core
COPY server ./server
COPY gateway ./gateway
COPY loadgen ./loadgen
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0
ARG EXTRAS=server
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATHPROBE_CACHE=/opt/pathprobe/cache
# torch first from its own index (a plain `torch` requirement would pull whatever PyPI's default is)
RUN pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"
COPY --from=wheel /wheels /wheels
RUN set -eux; whl=$(ls /wheels/pathprobe-*.whl); pip install "pathprobe[${EXTRAS}] @ file://${whl}"; rm -rf /wheels; \
    pathprobe make-model; chmod -R a+rX /opt/pathprobe; \
    useradd --uid 10001 --create-home --shell /usr/sbin/nologin pathprobe
USER 10001:10001
EXPOSE 50051 8000
HEALTHCHECK --interval=5s --timeout=3s --start-period=60s --retries=5 \
    CMD ["python", "-m", "pathprobe.probe", "grpc://127.0.0.1:50051"]
ENTRYPOINT ["pathprobe"]
CMD ["serve", "--host", "0.0.0.0", "--engine", "transformers", "--model", "tiny", "--grpc-port", "50051", "--http-port", "8000"]
