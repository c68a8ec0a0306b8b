"""The multi-host lab (deploy/lab/lab.py): client, gateway and server in three network
namespaces joined by veth links; a known delay on one link must show up as that hop's
network (network_hop2 for gateway<->server, network_hop1 for client<->gateway) and nowhere
else. Needs root and `ip netns` (CI has both)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("pathprobe_lab", ROOT / "deploy" / "lab" / "lab.py")
lab_mod = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = lab_mod  # dataclasses look their module up
_spec.loader.exec_module(lab_mod)

pytestmark = [pytest.mark.slow, pytest.mark.skipif(lab_mod.available() is not None, reason=str(lab_mod.available()))]

DELAY_MS = 10.0
PREFILL, DECODE, PROMPT, MAX_TOKENS = 0.05, 1.0, 64, 4


@pytest.mark.parametrize(
    "link,delayed,other",
    [("gateway-server", "network_hop2", "network_hop1"), ("client-gateway", "network_hop1", "network_hop2")],
)
def test_a_delay_on_one_link_is_that_hops_network(tmp_path: Path, link: str, delayed: str, other: str) -> None:
    lab = lab_mod.Lab(DELAY_MS, link, "relay")
    lab.logs = tmp_path
    with lab:
        # three namespaces, each end of each link in its own
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert all(lab.ns(h) in names for h in lab_mod.HOSTS)
        gw_addrs = lab.run_in("gateway", ["ip", "-o", "-4", "addr"]).stdout
        assert "198.18.1.2/30" in gw_addrs and "198.18.2.1/30" in gw_addrs
        # the client cannot reach the server: only the gateway joins the two links
        assert lab.run_in("client", ["ip", "route", "get", "198.18.2.2"], check=False).returncode != 0
        target = lab.start_path(
            ("--engine", "synthetic", "--prefill-ms-per-token", str(PREFILL), "--decode-ms-per-token", str(DECODE))
        )
        summary = lab.load(
            target,
            tmp_path / "load",
            ["-u", "1", "-r", "1", "-t", "5s", "--max-tokens", str(MAX_TOKENS), "--prompt-tokens", str(PROMPT)],
        )
    after = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(lab.ns(h) in after for h in lab_mod.HOSTS), "the lab left namespaces behind"
    route = summary["routes"]["grpc.Generate"]
    assert route["requests"] >= 20 and route["errors"] == 0, route
    m = route["metrics"]
    # one-way D each direction on that link: a unary call crosses it twice; the other link keeps none
    assert 2 * DELAY_MS - 0.5 <= m[delayed]["p50"] <= 2 * DELAY_MS + 6, m[delayed]
    assert m[other]["p50"] < DELAY_MS / 2, m[other]
    want_inference = PROMPT * PREFILL + (MAX_TOKENS - 1) * DECODE
    assert abs(m["inference"]["p50"] - want_inference) < 2.0, m["inference"]
    assert m["queueing"]["p50"] < 1.0
