"""Run the same calls with both gRPC clients under gevent, as a Locust worker runs them.

    python -m tests.support.grpc_clients ADDRESS TIMEOUT_S < specs.json > records.json

Input: a JSON list of CallSpec fields (plus optional "headers"). Output: a JSON list of
{"grpcio": record, "h2": record}, each built by the load generator's own ``build_record``.
"""

from __future__ import annotations

import json
import sys
import time

from pathprobe.loadgen.targets import CallSpec, GrpcTarget, H2GrpcTarget, Outcome
from pathprobe.loadgen.users import build_record  # imports Locust: gevent patches the process


def main() -> None:
    address, timeout_s = sys.argv[1], float(sys.argv[2])
    specs = json.load(sys.stdin)
    targets = {"grpcio": GrpcTarget(address, timeout_s), "h2": H2GrpcTarget(address, timeout_s)}
    out = []
    for raw in specs:
        headers = raw.pop("headers", {})
        spec = CallSpec(**raw)
        row = {}
        for name, target in targets.items():
            o = Outcome()
            target.call(spec, dict(headers), o)
            row[name] = build_record(o, spec, target.route(spec.stream), address, time.time(), 0, 0, "w")
        out.append(row)
    for t in targets.values():
        t.close()
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
