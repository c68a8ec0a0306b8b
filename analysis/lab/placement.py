"""CPU placement of a local compare: the engine, the proxies and the load generator on separate cores.

Unpinned, the model server, the gateways and the load generator of a local run share every
core, so a configuration whose proxy burns more CPU slows the *engine* too and the comparison
reports it as inference time. Pinned (``os.sched_setaffinity`` in each child before it
starts; threads and children inherit it), each group has its own cores:

- ``load``: the load generator (one core per 8, at least one);
- ``proxies``: gateways, nginx and delay relays (the same share);
- ``server``: the rest, for the engine (``OMP_NUM_THREADS`` is set to their number so torch
  does not run more threads than it has cores).

``auto`` (the default) pins when the process may use at least ``MIN_CORES_AUTO`` cores; ``on``
pins whenever there are two: on two cores the engine gets one and the proxies and load
generator share the other. ``off`` (or ``PATHPROBE_CPU_PLACEMENT=off``) leaves placement to
the kernel. The plan is written into report.json (``meta.placement``) and printed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from pathprobe import environment
from pathprobe.jsontypes import JsonObject

#: environment variable that overrides the config's ``placement`` (auto | on | off)
ENV_PLACEMENT = environment.PATHPROBE_CPU_PLACEMENT
MODES = ("auto", "on", "off")
MIN_CORES_AUTO = 3


@dataclass(frozen=True)
class Placement:
    enabled: bool
    reason: str
    server: tuple[int, ...] = ()
    proxies: tuple[int, ...] = ()
    load: tuple[int, ...] = ()
    available: tuple[int, ...] = field(default_factory=tuple)

    def cpus(self, role: str) -> tuple[int, ...]:
        """Cores for ``role`` (server | proxies | load); () when not pinned."""
        return getattr(self, role) if self.enabled else ()

    def env(self, role: str) -> dict[str, str]:
        if self.enabled and role == "server":
            return {"OMP_NUM_THREADS": str(len(self.server))}
        return {}

    def preexec(self, role: str) -> Callable[[], None] | None:
        """A ``preexec_fn`` that pins the child to the role's cores (None when not pinned)."""
        cpus = self.cpus(role)
        if not cpus:
            return None
        return lambda: os.sched_setaffinity(0, cpus)

    def as_dict(self) -> JsonObject:
        return {
            "enabled": self.enabled,
            "reason": self.reason,
            "available": list(self.available),
            "server": list(self.server),
            "proxies": list(self.proxies),
            "load": list(self.load),
        }

    def describe(self) -> str:
        if not self.enabled:
            return f"CPU placement: off ({self.reason})"
        return (
            f"CPU placement: engine/server on cores {_span(self.server)}, proxies on {_span(self.proxies)}, "
            f"load generator on {_span(self.load)} ({self.reason})"
        )


def _span(cpus: tuple[int, ...]) -> str:
    return ",".join(map(str, cpus))


def available_cpus() -> tuple[int, ...]:
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return ()


def plan(mode: str = "auto", cpus: tuple[int, ...] | None = None) -> Placement:
    """Split ``cpus`` (default: the cores this process may use) between server, proxies and load."""
    mode = os.environ.get(ENV_PLACEMENT, mode) or "auto"
    if mode not in MODES:
        from pathprobe.errors import ConfigError

        raise ConfigError(f"placement: expected one of {', '.join(MODES)} (or {ENV_PLACEMENT}), got {mode!r}")
    cpus = available_cpus() if cpus is None else tuple(sorted(cpus))
    n = len(cpus)
    if mode == "off":
        return Placement(False, "placement: off", available=cpus)
    if n < 2:
        return Placement(False, f"{n} core available: nothing to separate", available=cpus)
    if mode == "auto" and n < MIN_CORES_AUTO:
        return Placement(
            False,
            f"only {n} cores: auto pins from {MIN_CORES_AUTO}; placement: on pins anyway "
            "(engine on one core, the rest on the other)",
            available=cpus,
        )
    if n == 2:  # engine alone; proxies and load generator share the other core
        return Placement(
            True,
            "2 cores: the engine alone on one, proxies and load generator on the other",
            server=cpus[1:],
            proxies=cpus[:1],
            load=cpus[:1],
            available=cpus,
        )
    share = max(1, n // 8)
    load, proxies, server = cpus[:share], cpus[share : 2 * share], cpus[2 * share :]
    return Placement(True, f"{n} cores, mode {mode}", server=server, proxies=proxies, load=load, available=cpus)
