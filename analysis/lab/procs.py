"""Processes and ports of a local compare: free loopback ports, reachability, and the child
processes compare starts (each with its log file, its own process group, its cores)."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from pathprobe.address import parse_hostport
from pathprobe.errors import PathprobeError

LOOPBACK = "127.0.0.1"


#: the kernel's range for outgoing connections' local ports (and for ``bind(("", 0))``)
EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
#: the lowest port :func:`free_port` hands out when it picks below the ephemeral range
LOW_PORT = 10000


def _ephemeral_low() -> int | None:
    try:
        low = int(Path(EPHEMERAL_RANGE_FILE).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return low if low - LOW_PORT >= 1000 else None


#: the ports :func:`free_port` has handed out in this process
_GIVEN: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on, for a process started next.

    Picked at random *below* the kernel's ephemeral range where there is one: a port from
    ``bind(0)`` lies inside it, and between closing the probe socket and the child binding it,
    any outgoing connection on the machine (a load generator opening hundreds) may take it as
    its local port ("address already in use" at start). Below the range only another picker
    can collide, which a random choice makes rare; this process never hands out a port twice (a
    compare run picks ~40 before its processes bind them: one paired 2048-token run of
    bench/groundtruth_length.py lost a configuration to a port picked twice)."""
    low = _ephemeral_low()
    if low is not None:
        rng = random.SystemRandom()
        for _ in range(64):
            port = rng.randrange(LOW_PORT, low)
            if port not in _GIVEN and not port_in_use(LOOPBACK, port):
                _GIVEN.add(port)
                return port
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def port_in_use(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def reachable(address: str, timeout: float = 3.0) -> str | None:
    """None when a TCP connection to HOST:PORT succeeds, else the reason."""
    host, port = split_hostport(address)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        return exc.strerror or str(exc)


def split_hostport(address: str) -> tuple[str, int]:
    return parse_hostport(address, f"address {address!r}", default_host=LOOPBACK)


def port_of(hostport: str) -> int:
    return split_hostport(hostport)[1]


class Skipped(PathprobeError):
    """A configuration that cannot run here (a component is not installed); the reason is shown."""


@dataclass
class Managed:
    """A child process compare started; its output goes to a log file."""

    name: str
    args: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    popen: subprocess.Popen[bytes] | None = None
    cpus: tuple[int, ...] = ()  # pinned to these cores (inherited by its threads and children); () = any

    def start(self) -> Managed:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - the child's output until stop() closes it
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        cpus = self.cpus
        self.popen = subprocess.Popen(
            self.args,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
        )
        return self

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def exit_code(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def tail(self, n: int = 6) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " / ".join(lines[-n:])

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen is None:
            return
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.popen.wait()
        try:
            self._log.close()
        except Exception:
            pass


def pathprobe_cmd(*args: str) -> list[str]:
    """The command line of ``pathprobe ARGS`` with this interpreter."""
    return [sys.executable, "-m", "pathprobe", *args]


# ------------------------------------------------------------------ probes
