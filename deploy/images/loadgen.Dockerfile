# syntax=docker/dockerfile:1
# pathprobe load generator: `pathprobe load` (Locust: master, worker or standalone);
# `pathprobe[loadgen]` pulls no torch. The tiny model's tokenizer (exact prompt lengths
# against the tiny model) is built in a throw-away stage that has torch and copied over.
#   docker build -f deploy/images/loadgen.Dockerfile -t pathprobe-loadgen .
# HEALTHCHECK: Locust's web UI (master/standalone) or, for a worker, its metrics endpoint,
# through $PATHPROBE_HEALTH_URL.
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

FROM ${PYTHON_IMAGE} AS model
ENV PIP_NO_CACHE_DIR=1 PATHPROBE_CACHE=/opt/pathprobe/cache
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY --from=wheel /wheels /wheels
RUN whl=$(ls /wheels/pathprobe-*.whl) && pip install "pathprobe[server] @ file://${whl}" && pathprobe make-model \
    && chmod -R a+rX /opt/pathprobe

FROM ${PYTHON_IMAGE}
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATHPROBE_CACHE=/opt/pathprobe/cache PATHPROBE_HEALTH_URL=http://127.0.0.1:8089/
COPY --from=wheel /wheels /wheels
RUN set -eux; whl=$(ls /wheels/pathprobe-*.whl); pip install "pathprobe[loadgen] @ file://${whl}"; rm -rf /wheels; \
    ! python -c "import torch" 2>/dev/null; \
    useradd --uid 10001 --create-home --shell /usr/sbin/nologin pathprobe; \
    mkdir -p /out && chown 10001:10001 /out
COPY --from=model /opt/pathprobe/cache /opt/pathprobe/cache
USER 10001:10001
WORKDIR /home/pathprobe
EXPOSE 8089 5557 9646
HEALTHCHECK --interval=5s --timeout=3s --start-period=20s --retries=5 \
    CMD python -m pathprobe.probe "$PATHPROBE_HEALTH_URL"
ENTRYPOINT ["pathprobe", "load"]
CMD ["--help"]
