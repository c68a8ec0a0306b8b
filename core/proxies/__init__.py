"""Third-party gateways pathprobe starts and reads: nginx, HAProxy, Caddy, LiteLLM.

Each one gets a config rendered from a template in this folder (``{{NAME}}`` placeholders,
strict: a missing value is an error) into a prefix folder, and a command line that runs
it in the foreground. The nginx, HAProxy and Caddy configs make the proxy REPORT its own
time as a Server-Timing hop (``nginx.*``, ``haproxy.*``, ``caddy.*``) where the proxy can;
LiteLLM reports in its own ``x-litellm-*`` headers (read by :mod:`pathprobe.reporters`).

    python -m pathprobe.proxies haproxy --prefix /tmp/hap --listen 127.0.0.1:9090 \\
        --upstream 127.0.0.1:50051 --protocol grpc          # prints the command to run
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pathprobe import environment
from pathprobe.address import parse_hostport
from pathprobe.errors import ConfigError

TEMPLATES = Path(__file__).parent
PROXIES = ("nginx", "haproxy", "caddy", "litellm")
#: the largest request body a proxy accepts unless told otherwise (as our server's and gateway's default)
DEFAULT_MAX_BODY = 4 * 1024 * 1024
PROTOCOLS = {"nginx": ("grpc", "http"), "haproxy": ("grpc", "http"), "caddy": ("grpc", "http"), "litellm": ("openai",)}
#: the executable of LiteLLM's proxy (it lives in its own virtual environment: its pins clash)
ENV_LITELLM = environment.PATHPROBE_LITELLM
#: where .ci/run installs LiteLLM, relative to the working directory
LITELLM_VENV = ".venv-litellm"
#: the streaming RPC: proxies that can only report at the response header stay silent on it
GRPC_STREAM_PATH = "/pathprobe.v1.LLM/GenerateStream"

_PLACEHOLDER = re.compile(r"\{\{([A-Z_]+)\}\}")


@dataclass(frozen=True)
class Launch:
    """How to run one proxy: its command line, extra environment and rendered config."""

    proxy: str
    args: list[str]
    config: Path
    env: dict[str, str] = field(default_factory=dict)
    #: headers a client must send (LiteLLM's master key)
    headers: dict[str, str] = field(default_factory=dict)


def fill(template: str, values: Mapping[str, str]) -> str:
    """Replace every ``{{NAME}}``; a placeholder without a value is an error naming it."""

    def repl(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in values:
            raise ConfigError(f"proxy template: no value for {{{{{name}}}}}")
        return str(values[name])

    return _PLACEHOLDER.sub(repl, template)


def render(template: str, prefix: str | os.PathLike[str], out_name: str, values: Mapping[str, str]) -> Path:
    """Fill ``template`` (a file in this folder) into ``prefix/out_name``."""
    d = Path(prefix).resolve()
    (d / "tmp").mkdir(parents=True, exist_ok=True)
    out = d / out_name
    out.write_text(fill((TEMPLATES / template).read_text(encoding="utf-8"), values), encoding="utf-8")
    return out


def executable(proxy: str) -> str | None:
    """The proxy's executable, or None when it is not installed."""
    if proxy == "litellm":
        given = environment.get(ENV_LITELLM)
        if given:
            return given if os.access(given, os.X_OK) else None
        local = Path(LITELLM_VENV) / "bin" / "litellm"
        if local.exists():
            return str(local.resolve())
        return shutil.which("litellm")
    return shutil.which(proxy)


def missing_reason(proxy: str) -> str:
    if proxy == "litellm":
        return (
            f"LiteLLM is not installed (set {ENV_LITELLM} to its `litellm` executable, or "
            f"`python -m venv {LITELLM_VENV} && {LITELLM_VENV}/bin/pip install 'litellm[proxy]'`)"
        )
    return f"{proxy} is not installed (not on PATH)"


def _check(proxy: str, protocol: str) -> None:
    if protocol not in PROTOCOLS[proxy]:
        raise ConfigError(f"{proxy} proxies {', '.join(PROTOCOLS[proxy])}, not '{protocol}'")


def _split(listen: str) -> tuple[str, str]:
    host, port = parse_hostport(listen, "listen", default_host="127.0.0.1")
    return host, str(port)


def nginx(
    prefix: str | os.PathLike[str],
    listen: str,
    upstreams: Sequence[str],
    protocol: str = "grpc",
    workers: int = 1,
    exe: str = "nginx",
    max_body: int = DEFAULT_MAX_BODY,
) -> Launch:
    _check("nginx", protocol)
    d = Path(prefix).resolve()
    for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (d / "tmp" / sub).mkdir(parents=True, exist_ok=True)
    user = "user root;\n" if hasattr(os, "geteuid") and os.geteuid() == 0 else ""
    conf = render(
        f"nginx-{protocol}.conf.template",
        d,
        "nginx.conf",
        {
            "USER": user,
            "WORKERS": str(workers),
            "PREFIX": str(d),
            "LISTEN": listen,
            "UPSTREAMS": "\n        ".join(f"server {u};" for u in upstreams),
            "MAX_BODY": str(max_body),
        },
    )
    return Launch("nginx", [exe, "-p", str(d), "-e", str(d / "error.log"), "-c", str(conf), "-g", "daemon off;"], conf)


def haproxy(
    prefix: str | os.PathLike[str],
    listen: str,
    upstreams: Sequence[str],
    protocol: str = "grpc",
    threads: int = 1,
    exe: str = "haproxy",
) -> Launch:
    _check("haproxy", protocol)
    opts = " proto h2" if protocol == "grpc" else ""
    conf = render(
        "haproxy.cfg.template",
        prefix,
        "haproxy.cfg",
        {
            "THREADS": str(threads),
            "LISTEN": listen,
            "BIND_OPTS": opts.strip(),
            "STREAM_PATH": "^" + re.escape(GRPC_STREAM_PATH) + "$" if protocol == "grpc" else "^$",
            "SERVERS": "\n    ".join(f"server s{i} {u}{opts}" for i, u in enumerate(upstreams, 1)),
        },
    )
    return Launch("haproxy", [exe, "-f", str(conf), "-db"], conf)


CADDY_REPORT = """    @unary not path {stream}
    header @unary {{
        +Server-Timing "caddy.upstream;dur={{http.reverse_proxy.upstream.latency_ms}};desc=until-response-header"
        defer
    }}"""


def caddy(
    prefix: str | os.PathLike[str],
    listen: str,
    upstreams: Sequence[str],
    protocol: str = "grpc",
    exe: str = "caddy",
    max_body: int = DEFAULT_MAX_BODY,
) -> Launch:
    _check("caddy", protocol)
    host, port = _split(listen)
    scheme = "h2c://" if protocol == "grpc" else ""
    report = CADDY_REPORT.format(stream=GRPC_STREAM_PATH) if protocol == "grpc" else ""
    conf = render(
        "Caddyfile.template",
        prefix,
        "Caddyfile",
        {
            "HOST": host,
            "PORT": port,
            "REPORT": report,
            "UPSTREAMS": " ".join(scheme + u for u in upstreams),
            "MAX_BODY": str(max_body),
        },
    )
    d = Path(prefix).resolve()
    # Caddy writes its autosave/data under HOME/XDG folders: keep them in the prefix
    env = {"XDG_DATA_HOME": str(d / "data"), "XDG_CONFIG_HOME": str(d / "config")}
    return Launch("caddy", [exe, "run", "--config", str(conf), "--adapter", "caddyfile"], conf, env)


def litellm(
    prefix: str | os.PathLike[str],
    listen: str,
    upstreams: Sequence[str],
    protocol: str = "openai",
    model: str = "synthetic",
    master_key: str | None = None,
    exe: str = "litellm",
) -> Launch:
    """LiteLLM proxy in front of the first upstream's OpenAI routes (``HOST:PORT`` of its HTTP port)."""
    _check("litellm", protocol)
    if not upstreams:
        raise ConfigError("litellm: needs the server's HTTP address")
    host, port = _split(listen)
    conf = render(
        "litellm.yaml.template", prefix, "litellm.yaml", {"MODEL": model, "API_BASE": f"http://{upstreams[0]}/v1"}
    )
    key = master_key or "sk-pathprobe-" + secrets.token_hex(8)
    env = {
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_MASTER_KEY": key,
        "LITELLM_DETAILED_TIMING": "true",
        "LITELLM_LOG": "ERROR",
        "NO_DOCS": "True",
    }
    return Launch(
        "litellm",
        [exe, "--config", str(conf), "--host", host, "--port", port, "--num_workers", "1"],
        conf,
        env,
        {"Authorization": f"Bearer {key}"},
    )


BUILDERS: dict[str, Callable[..., Launch]] = {"nginx": nginx, "haproxy": haproxy, "caddy": caddy, "litellm": litellm}


def launch(
    proxy: str, prefix: str | os.PathLike[str], listen: str, upstreams: Sequence[str], protocol: str, **kw: object
) -> Launch:
    """The :class:`Launch` of ``proxy`` (one of :data:`PROXIES`), with its installed executable."""
    if proxy not in PROXIES:
        raise ConfigError(f"unknown proxy {proxy!r} (one of {', '.join(PROXIES)})")
    exe = executable(proxy)
    if exe is None:
        raise ConfigError(missing_reason(proxy))
    fn: Callable[..., Launch] = BUILDERS[proxy]
    return fn(prefix, listen, upstreams, protocol, exe=exe, **kw)


def main(argv: list[str] | None = None) -> int:
    import argparse
    import shlex

    p = argparse.ArgumentParser(prog="python -m pathprobe.proxies", description=__doc__.splitlines()[0])
    p.add_argument("proxy", choices=PROXIES)
    p.add_argument("--prefix", required=True, help="folder for the rendered config, pid and temp files")
    p.add_argument("--listen", default="127.0.0.1:9090")
    p.add_argument("--upstream", default="127.0.0.1:50051", help="HOST:PORT[,HOST:PORT...] (LiteLLM: the HTTP port)")
    p.add_argument("--protocol", default=None, help="grpc | http (nginx, haproxy, caddy); openai (litellm)")
    a = p.parse_args(argv)
    protocol = a.protocol or PROTOCOLS[a.proxy][0]
    fn: Callable[..., Launch] = BUILDERS[a.proxy]
    try:
        lz = fn(a.prefix, a.listen, a.upstream.split(","), protocol)
    except ConfigError as exc:
        p.error(str(exc))
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in lz.env.items())
    print((env + " " if env else "") + shlex.join(lz.args))
    return 0
