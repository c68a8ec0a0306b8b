"""``HOST:PORT`` addresses: the one parser every component uses."""

from __future__ import annotations

from pathprobe.errors import ConfigError


def parse_hostport(value: str, what: str, default_host: str | None = None) -> tuple[str, int]:
    """``"127.0.0.1:8000"``, ``"[::1]:8000"`` or ``"grpc://h:p/path"`` -> ``(host, port)``.

    ``what`` names the flag or key in the error. Without ``default_host`` the host is
    required; with it, ``":8000"`` means that host.
    """
    rest = value.strip().split("://", 1)[-1].split("/", 1)[0]
    host, sep, port = rest.rpartition(":")
    host = host.strip("[]") or (default_host or "")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"{what}: expected HOST:PORT (or scheme://HOST:PORT), got {value!r}")
    return host, int(port)


def host_and_port(target: str) -> tuple[str, int]:
    """Split a ``HOST:PORT`` this program already validated (no error path)."""
    host, _, port = target.rpartition(":")
    return host.strip("[]"), int(port)
