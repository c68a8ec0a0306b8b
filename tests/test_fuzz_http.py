"""schemathesis against the HTTP API (the OpenAPI document the server publishes), at both server
front ends and at the two HTTP gateways: no 5xx, no crash, no hang; fixed budgets."""

from __future__ import annotations

import urllib.request

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from pathprobe.server.openapi import document
from schemathesis.checks import not_a_server_error

from tests.support.procs import Server

pytestmark = pytest.mark.slow
schema = schemathesis.openapi.from_dict(document())
TARGETS = ["server-aiohttp", "server-fastapi", "gateway-transcode", "gateway-http-proxy"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    from tests.test_gateway import Gateway

    tmp = tmp_path_factory.mktemp("fuzz-http")
    # a short queue and a body limit, so overload and size answers are fuzzed too
    common = ("--engine", "synthetic", "--max-batch-size", "4", "--max-queue", "8", "--max-body-bytes", "65536")
    a = Server(tmp, *common)
    f = Server(tmp, *common, "--http-server", "fastapi")
    procs = [a, f]
    try:
        tc = Gateway(tmp, "transcode", a.grpc_target, "--max-body-bytes", "65536")
        procs.append(tc)
        hp = Gateway(tmp, "http-proxy", f"127.0.0.1:{a.http_port}")
        procs.append(hp)
        urls = {
            "server-aiohttp": a.http_url,
            "server-fastapi": f.http_url,
            "gateway-transcode": tc.url,
            "gateway-http-proxy": hp.url,
        }
        yield urls, procs
    finally:
        for p in procs:
            p.stop()


@pytest.fixture(params=TARGETS)
def base_url(request, stack) -> str:
    return stack[0][request.param]


@schema.parametrize()
@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.filter_too_much],
)
def test_no_server_errors(case, base_url) -> None:
    case.call_and_validate(base_url=base_url, checks=[not_a_server_error], timeout=30)


def test_every_process_survived(stack) -> None:
    urls, procs = stack
    assert all(p.popen.poll() is None for p in procs)
    for name, url in urls.items():
        with urllib.request.urlopen(f"{url}/healthz", timeout=5) as r:
            assert r.status == 200, name
    # the fuzzer reached the routes (direct and through both gateways), good and bad bodies alike
    with urllib.request.urlopen(f"{urls['server-aiohttp']}/metrics", timeout=5) as r:
        lines = [x for x in r.read().decode().splitlines() if x.startswith("pathprobe_server_requests_total")]
    by_code: dict[str, float] = {}
    for x in lines:
        code = x.split('code="', 1)[1].split('"', 1)[0]
        by_code[code] = by_code.get(code, 0) + float(x.rsplit(" ", 1)[1])
    assert by_code.get("400", 0) + by_code.get("INVALID_ARGUMENT", 0) > 20 and by_code.get("200", 0) > 10, by_code
    assert not any(c.startswith("5") or c in ("INTERNAL", "UNKNOWN") for c in by_code), by_code


def test_the_fuzzed_document_is_the_served_one(stack) -> None:
    import json

    urls, _ = stack
    for name in ("server-aiohttp", "server-fastapi"):
        with urllib.request.urlopen(f"{urls[name]}/openapi.json", timeout=5) as r:
            assert json.loads(r.read()) == json.loads(json.dumps(document())), name
