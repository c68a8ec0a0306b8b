# syntax=docker/dockerfile:1
# pathprobe gateway: `pathprobe gateway` in any mode; `pathprobe[gateway]` pulls no torch.
#   docker build -f deploy/images/gateway.Dockerfile -t pathprobe-gateway .
# HEALTHCHECK probes $PATHPROBE_HEALTH_URL: gRPC health through a gRPC listener
# (passthrough, reencode: the call crosses the gateway to the server), or /healthz of an
# HTTP listener (transcode, http-proxy). Compose and Kubernetes set it per mode.
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
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATHPROBE_HEALTH_URL=grpc://127.0.0.1:9000
COPY --from=wheel /wheels /wheels
RUN set -eux; whl=$(ls /wheels/pathprobe-*.whl); pip install "pathprobe[gateway] @ file://${whl}"; rm -rf /wheels; \
    ! python -c "import torch" 2>/dev/null; \
    useradd --uid 10001 --create-home --shell /usr/sbin/nologin pathprobe
USER 10001:10001
EXPOSE 9000 9100
HEALTHCHECK --interval=5s --timeout=3s --start-period=10s --retries=5 \
    CMD python -m pathprobe.probe "$PATHPROBE_HEALTH_URL"
ENTRYPOINT ["pathprobe"]
CMD ["gateway", "--mode", "passthrough", "--listen", "0.0.0.0:9000", "--upstream", "server:50051", "--admin-port", "9100"]
