"""``pathprobe netem``: run the delaying TCP relay in front of any TCP service."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence

from pathprobe import address
from pathprobe.errors import ConfigError

HELP = "delaying TCP relay: put a one-way delay (and loss/bandwidth limit) on one hop"


def parse_hostport(value: str, what: str) -> tuple[str, int]:
    return address.parse_hostport(value, what, default_host="127.0.0.1")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT to accept on (port 0: any free port)")
    p.add_argument("--upstream", required=True, help="HOST:PORT to forward to")
    p.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay, applied to each direction")
    p.add_argument("--jitter-ms", type=float, default=0.0)
    p.add_argument("--loss", type=float, default=0.0, help="probability a chunk costs one RTO (0..1)")
    p.add_argument("--rto-ms", type=float, default=200.0)
    p.add_argument("--rate-mbit", type=float, default=None, help="bandwidth limit per direction")
    p.add_argument("--seed", type=int, default=0)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("netem", help=HELP, description=HELP)
    add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathprobe.netem.relay import DelayRelay, LinkSpec

    for name in ("delay_ms", "jitter_ms", "rto_ms"):
        if getattr(args, name) < 0:
            raise ConfigError(f"--{name.replace('_', '-')}: must be >= 0")
    if not 0 <= args.loss < 1:
        raise ConfigError("--loss: must be in [0, 1)")
    spec = LinkSpec(args.delay_ms, args.jitter_ms, args.loss, args.rto_ms, args.rate_mbit)
    try:
        relay = DelayRelay(
            parse_hostport(args.upstream, "--upstream"), spec, parse_hostport(args.listen, "--listen"), seed=args.seed
        )
    except OSError as exc:
        raise ConfigError(f"--listen {args.listen}: cannot bind: {exc.strerror or exc}") from None
    relay.start()
    print(f"netem relay listening on {relay.address} -> {args.upstream}: {spec.describe()}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    relay.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pathprobe netem", description=HELP)
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        return run(args)
    except ConfigError as exc:
        print(f"pathprobe netem: error: {exc.message}", file=sys.stderr)
        return 2
