"""A multi-host lab on one machine: client, gateway and server each in its own network
namespace, joined by veth links, with an optional one-way delay on one link.

    sudo .venv/bin/python deploy/lab/lab.py run --delay-ms 10 --link gateway-server -t 10s --out out/lab

    client ns                 gateway ns                       server ns
    pathprobe load  --veth--  pathprobe gateway  --veth--  [delay relay] -> pathprobe serve
    198.18.1.1/30             198.18.1.2 | 198.18.2.1         198.18.2.2/30

Addresses come from 198.18.0.0/15, the range set aside for network benchmarks (RFC 2544);
the links exist only between these namespaces. The delay: `tc netem` where the kernel has
it (`--netem tc`); otherwise (`--netem relay`, the default) pathprobe's delaying TCP relay
runs at the far end of the delayed link, inside that host's namespace, holding every chunk
D ms per direction before it reaches the process (core/netem/relay.py). Either way the
delay sits on that hop's wire, so the split must book it as that hop's network.
Needs root and iproute2 (`ip netns`). Everything the lab made is removed when it ends.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

HOSTS = ("client", "gateway", "server")
#: link name -> (host a, host b, subnet prefix); a gets .1, b gets .2
LINKS = {"client-gateway": ("client", "gateway", "198.18.1"), "gateway-server": ("gateway", "server", "198.18.2")}
GRPC_PORT = 50051
HTTP_PORT = 8000
GATEWAY_PORT = 9000
INNER_OFFSET = 10  # a relayed service listens on loopback at port + this; the relay takes the port


class LabError(RuntimeError):
    """The lab cannot be set up here (not root, no `ip netns`, a command failed)."""


def available() -> str | None:
    """None when a lab can run here, else why not."""
    if os.geteuid() != 0:
        return "the lab needs root (network namespaces)"
    if shutil.which("ip") is None:
        return "iproute2 (`ip`) is not installed"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"`ip netns` does not work here: {probe.stderr.strip()}"
    return None


def netem_in_kernel() -> bool:
    """Whether `tc qdisc ... netem` exists (it does not on every kernel)."""
    if shutil.which("tc") is None or shutil.which("modprobe") is None:
        return False
    return subprocess.run(["modprobe", "-n", "sch_netem"], capture_output=True).returncode == 0


def _ip(*args: str) -> None:
    out = subprocess.run(["ip", *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise LabError(f"ip {' '.join(args)}: {out.stderr.strip()}")


@dataclass
class Lab:
    delay_ms: float = 0.0
    link: str = "gateway-server"
    netem: str = "relay"  # relay | tc
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    python: str = sys.executable
    procs: list[subprocess.Popen] = field(default_factory=list)
    logs: Path | None = None

    def ns(self, host: str) -> str:
        return f"pp{self.tag}-{host}"

    def addr(self, host: str, link: str) -> str:
        a, _, prefix = LINKS[link]
        return f"{prefix}.{1 if host == a else 2}"

    # --- network ---
    def up(self) -> Lab:
        why = available()
        if why:
            raise LabError(why)
        if self.link not in LINKS:
            raise LabError(f"--link: expected one of {', '.join(LINKS)}, got {self.link!r}")
        try:
            for h in HOSTS:
                _ip("netns", "add", self.ns(h))
                _ip("-n", self.ns(h), "link", "set", "lo", "up")
            for i, (name, (a, b, prefix)) in enumerate(LINKS.items()):
                va, vb = f"pp{self.tag}{i}a", f"pp{self.tag}{i}b"  # <= 15 characters
                _ip("link", "add", va, "type", "veth", "peer", "name", vb)
                _ip("link", "set", va, "netns", self.ns(a))
                _ip("link", "set", vb, "netns", self.ns(b))
                for host, dev, last in ((a, va, 1), (b, vb, 2)):
                    _ip("-n", self.ns(host), "addr", "add", f"{prefix}.{last}/30", "dev", dev)
                    _ip("-n", self.ns(host), "link", "set", dev, "up")
                if name == self.link and self.delay_ms and self.netem == "tc":
                    for host, dev in ((a, va), (b, vb)):
                        self.run_in(
                            host, ["tc", "qdisc", "add", "dev", dev, "root", "netem", "delay", f"{self.delay_ms}ms"]
                        )
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.procs.clear()
        for h in HOSTS:  # deleting a namespace deletes its end of every veth pair
            subprocess.run(["ip", "netns", "del", self.ns(h)], capture_output=True)

    def __enter__(self) -> Lab:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    # --- processes ---
    def run_in(self, host: str, argv: Sequence[str], **kw) -> subprocess.CompletedProcess:
        out = subprocess.run(["ip", "netns", "exec", self.ns(host), *argv], capture_output=True, text=True, **kw)
        if out.returncode != 0 and kw.get("check", True):
            raise LabError(f"{host}: {' '.join(argv)}: {out.stderr.strip()}")
        return out

    def spawn(self, host: str, name: str, argv: Sequence[str]) -> subprocess.Popen:
        log_path = (self.logs / f"{name}.log") if self.logs else Path(os.devnull)
        with open(log_path, "wb") as log:  # the child keeps its own copy of the descriptor
            p = subprocess.Popen(
                ["ip", "netns", "exec", self.ns(host), *argv],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        self.procs.append(p)
        return p

    def pathprobe(self, *args: str) -> list[str]:
        return [self.python, "-m", "pathprobe", *args]

    def _relayed(self, host: str, port: int, link: str) -> tuple[str, int]:
        """Where the process on ``host`` listens; starts the relay in front of it when the
        delayed link ends at this host."""
        if self.delay_ms and self.netem == "relay" and link == self.link:
            inner = port + INNER_OFFSET
            self.spawn(
                host,
                f"relay-{host}",
                self.pathprobe(
                    "netem",
                    "--listen",
                    f"{self.addr(host, link)}:{port}",
                    "--upstream",
                    f"127.0.0.1:{inner}",
                    "--delay-ms",
                    str(self.delay_ms),
                ),
            )
            return "127.0.0.1", inner
        return "0.0.0.0", port

    def start_path(self, server_args: Sequence[str] = ("--engine", "synthetic"), timeout: float = 120.0) -> str:
        """Server and gateway up and healthy; returns the gateway address as the client sees it."""
        host, port = self._relayed("server", GRPC_PORT, "gateway-server")
        self.spawn(
            "server",
            "server",
            self.pathprobe(
                "serve", "--host", host, "--grpc-port", str(port), "--http-port", str(HTTP_PORT), *server_args
            ),
        )
        ghost, gport = self._relayed("gateway", GATEWAY_PORT, "client-gateway")
        self.spawn(
            "gateway",
            "gateway",
            self.pathprobe(
                "gateway",
                "--mode",
                "passthrough",
                "--listen",
                f"{ghost}:{gport}",
                "--upstream",
                f"{self.addr('server', 'gateway-server')}:{GRPC_PORT}",
            ),
        )
        target = f"{self.addr('gateway', 'client-gateway')}:{GATEWAY_PORT}"
        self.wait_healthy("client", f"grpc://{target}", timeout)  # through the gateway to the server
        return target

    def wait_healthy(self, host: str, url: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            dead = [p for p in self.procs if p.poll() is not None]
            if dead:
                raise LabError(f"a lab process exited with {dead[0].returncode}: {' '.join(dead[0].args)}")
            out = self.run_in(host, [self.python, "-m", "pathprobe.probe", url], check=False, timeout=30)
            if out.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise LabError(f"{url} not healthy from {host} after {timeout}s: {out.stderr.strip()}")
            time.sleep(0.5)

    def load(self, target: str, out: Path, load_args: Sequence[str]) -> dict:
        """A headless `pathprobe load` from the client namespace; returns its summary."""
        self.run_in(
            "client",
            self.pathprobe(
                "load",
                "--headless",
                "-H",
                f"grpc://{target}",
                "--out",
                str(out),
                "--label",
                f"lab {self.link} +{self.delay_ms:g}ms",
                *load_args,
            ),
            timeout=900,
        )
        return json.loads((out / "summary.json").read_text())


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    netem = args.netem
    if netem == "auto":
        netem = "tc" if netem_in_kernel() else "relay"
    lab = Lab(args.delay_ms, args.link, netem)
    lab.logs = out
    with lab:
        target = lab.start_path(shlex.split(args.server_args))
        summary = lab.load(target, out, ["-u", str(args.users), "-r", str(args.users), "-t", args.run_time])
    for route, rs in summary["routes"].items():
        m = rs["metrics"]
        cells = ", ".join(
            f"{k} {m[k]['p50']:.2f}" for k in ("e2e", "network_hop1", "network_hop2", "inference") if k in m
        )
        print(
            f"lab: {route}: p50 ms: {cells} ({rs['requests']} requests; delay {args.delay_ms:g} ms one-way on "
            f"{args.link}, {netem})"
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="lab.py", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="set up the namespaces, run a load through the path, tear down")
    r.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay on --link (each direction)")
    r.add_argument("--link", choices=list(LINKS), default="gateway-server")
    r.add_argument("--netem", choices=("auto", "tc", "relay"), default="auto")
    r.add_argument("-u", "--users", type=int, default=1)
    r.add_argument("-t", "--run-time", default="10s")
    r.add_argument("--out", default="out/lab")
    r.add_argument(
        "--server-args",
        default="--engine synthetic --prefill-ms-per-token 0.05 --decode-ms-per-token 1",
        help="engine arguments for `pathprobe serve` (one string)",
    )
    args = p.parse_args(argv)
    try:
        return run(args)
    except LabError as exc:
        print(f"lab: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
