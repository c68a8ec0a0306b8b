"""The wire witness: where a request's "network" time really went, from a packet capture.

The in-band split books as network whatever no hop measured. This module captures the
run's packets on the loopback interface (``tcpdump``, nanosecond timestamps) and, for
requests at concurrency 1 (one request in flight in the whole system, so every data
packet inside a request's window belongs to it), splits each link's network time into:

- **wire**: packet to packet -- from the request's first packet entering the link to its
  first packet reaching the inner hop, plus from the response's last packet leaving the
  inner hop to its last packet leaving the link. On loopback without a relay both
  packets are the same capture (0); a delaying relay's hold is wire time.
- **hop_wait**: the inner hop's wait for its own event loop before its first timestamp
  (``<kind>.wait``, :mod:`pathprobe.loopwait`) as the split booked it: the hop's queueing, not the
  link's network. It must fit inside that hop's stack (``stack_inner``, where the packets show the
  bytes had arrived): ``wait_over`` counts the requests where it does not (an over-stated bound);
- **outer_wait**: the outer side's wait for its own event loop as the split booked it, which must fit
  in that side's stack (``stack_outer``): the client's (``client_wait``) on the first link, a gateway's
  after its upstream answered (``<kind>.upwait``) on the link behind it;
- **stack** of each side: packet to the application's timestamps -- the client from its
  request start (``t0``) to its first packet and from the last response packet to the
  end of its timing (gRPC core / HTTP client, event-loop wake-up, the client's wait);
  a reporting hop's packet window minus the time it reports (``*.total`` less a stream's
  ``*.send`` on the side facing its client, ``gw.upstream`` vs the upstream link's packet
  window on the other).

A hop that reports nothing (nginx) is seen as a packet window only: its time between
its client link and its upstream link is listed as ``silent_hop`` (the split books it as
network on the client's link).

Clocks: packets carry CLOCK_REALTIME (the capture's wall clock). Each hop reports
durations only; the client's records carry ``t0_wall_ns``, its monotonic start mapped to
the wall clock with the offset between the two clocks read at the end of the same
request (they differ by a constant apart from NTP slewing, at most 0.05% of the
request's time). Only the client needs a mapping: a hop's stack is its packet window
(wall clock, one capture) minus its reported duration (its own monotonic clock).

By construction, per link ``wire + stacks - hop_wait - outer_wait`` equals the split's network for
that link whatever packets were matched (the packets only move time between wire and stacks); the
witness's own content is *where* that time sits, and its checks are that no stack is negative (a
hop never reports more than its packets allow, which a request matched to another's packets often
would), that each booked wait fits in the stack it comes out of, and that a known delay appears on
the wire.

Above concurrency 1 a request's packets are found by its trace id instead of its time window
(:mod:`pathprobe.analysis.lab.wirestreams`, :func:`analyze_by_trace`); the rest is the same.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import statistics
import subprocess
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    import dpkt

from pathprobe.errors import PathprobeError
from pathprobe.records import RequestRecord

#: a stack below this (ms) means a hop reported more time than its packets allow (or a mismatch): counted
NEGATIVE_MS = -0.05

#: a witness section as it goes into report.json (per request, per link, per configuration): JSON-bound,
#: its keys documented in docs/compare.md; one alias rather than a TypedDict per level (the summary's
#: keys follow the links' float fields)
Section: TypeAlias = "dict[str, Any]"


# ------------------------------------------------------------------ capture


#: the kernel's buffer for the capture (``tcpdump -B``), KiB
CAPTURE_BUFFER_KIB = 32768
#: before it is stopped, how long the capture file must stay the same size (s): tcpdump stops at
#: SIGINT without reading what its kernel buffer still holds, and a run's last request lost its last
#: packets (257 of a 2048-token stream's, 13 ms of them: its witness showed the gateway's side of the
#: client link 12 ms below zero)
DRAINED_S = 0.2
_DROPPED = re.compile(rb"(\d+) packets? dropped by kernel")


def kernel_drops(log_path: Path) -> int | None:
    """The packets the kernel dropped because tcpdump fell behind (its summary at exit), or None when
    the log has no summary. A dropped packet is a hole in its connection's bytes
    (:mod:`pathprobe.analysis.lab.wirestreams` reads on after it)."""
    try:
        m = _DROPPED.search(Path(log_path).read_bytes())
    except OSError:
        return None
    return int(m.group(1)) if m else None


class Capture:
    """``tcpdump -i lo`` on the given TCP ports into a pcap file (nanosecond timestamps)."""

    def __init__(self, path: Path, ports: Iterable[int], interface: str = "lo", *, payloads: bool = False) -> None:
        self.path = Path(path)
        self.ports = sorted(set(ports))
        self.interface = interface
        #: whole packets (to find a request by its trace id at any concurrency), else the headers only
        self.snaplen = 0 if payloads else 256
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.path.with_suffix(".log")

    def start(self, timeout: float = 10.0) -> Capture:
        exe = shutil.which("tcpdump")
        if not exe:
            raise PathprobeError("witness pcap: tcpdump is not installed (apt-get install tcpdump)")
        if not self.ports:
            raise PathprobeError("witness pcap: no ports to capture")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        expr = " or ".join(f"tcp port {p}" for p in self.ports)
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - open while tcpdump runs
        self.proc = subprocess.Popen(
            [
                exe,
                "-i",
                self.interface,
                "--time-stamp-precision=nano",
                "-U",
                "-n",
                "-B",  # the kernel's capture buffer, KiB: whole packets of a busy run overflow the default 2 MiB
                str(CAPTURE_BUFFER_KIB),
                "-s",
                str(self.snaplen),
                "-w",
                str(self.path),
                expr,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PathprobeError(
                    f"witness pcap: tcpdump exited with code {self.proc.returncode}: "
                    f"{self.log_path.read_text(errors='replace').strip()[-300:]}"
                )
            if b"listening on" in self.log_path.read_bytes():
                return self
            time.sleep(0.05)
        self.stop()
        raise PathprobeError("witness pcap: tcpdump did not start listening within 10 s")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self._drain()
            try:
                os.killpg(self.proc.pid, signal.SIGINT)  # tcpdump writes what it buffered and exits
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()
        self.proc = None

    def _drain(self, timeout: float = 5.0) -> None:
        """Wait until tcpdump has written what its kernel buffer held: the file's size the same for
        :data:`DRAINED_S` (it writes each packet as it reads it, ``-U``), ``timeout`` at most."""
        deadline = time.monotonic() + timeout
        size, since = -1, time.monotonic()
        while time.monotonic() < deadline:
            now = self.path.stat().st_size if self.path.exists() else 0
            if now != size:
                size, since = now, time.monotonic()
            elif time.monotonic() - since >= DRAINED_S:
                return
            time.sleep(0.05)


# ------------------------------------------------------------------ packets


@dataclass(frozen=True, slots=True)
class Packet:
    ts_ns: int
    sport: int
    dport: int
    size: int  # TCP payload bytes (0 packets are not kept)
    #: the packet holds only the end of an HTTP/1.1 event stream (:func:`is_stream_tail`)
    tail: bool = False


#: an event stream's last event, which carries no data (OpenAI's and pathprobe's streams end with it)
_DONE = (b"data: [DONE]", b"data:[DONE]")
#: the longest stream tail read as one (``data: [DONE]`` and the last chunk, each in a chunk: ~35 bytes);
#: a longer packet is not one, and is not copied to tell
TAIL_MAX = 64


def is_stream_tail(payload: bytes) -> bool:
    """Whether ``payload`` is only what follows an HTTP/1.1 event stream's last event: ``data: [DONE]``
    and the chunked encoding's last chunk (``0\r\n\r\n``), in chunks or not. No hop times it: a
    server's total and a gateway's ``gw.upstream`` end at the last event that carries timing, so a
    response's packet window ends at the packet before these (else the side that read the stream shows
    a stack below zero: ~80 % of http-proxy's streams at c=1)."""
    if len(payload) > TAIL_MAX:
        return False
    if payload.strip() in _DONE:
        return True
    i, n = 0, len(payload)
    while i < n:
        j = payload.find(b"\r\n", i)
        if j < 0:
            return False
        try:
            size = int(payload[i:j].split(b";")[0], 16)
        except ValueError:
            return False
        if size == 0:
            return payload[j + 2 :] == b"\r\n"
        body = payload[j + 2 : j + 2 + size]
        if body.strip() not in _DONE or payload[j + 2 + size : j + 4 + size] != b"\r\n":
            return False
        i = j + 4 + size
    return n > 0


_H2_CONTROL = {4, 6, 8}  # SETTINGS, PING, WINDOW_UPDATE
_H2_PREFACE = b"PRI * HTTP/2.0"


def _h2_control_only(payload: bytes, size: int) -> bool:
    """True when the packet holds nothing but HTTP/2 flow-control/keep-alive frames (SETTINGS, PING,
    WINDOW_UPDATE): they carry no request or response bytes and can come after the response (a PING
    ack), so they must not end a response's packet window. Any other payload (HTTP/1.1 included) is
    kept: it has to parse exactly into such frames to be dropped."""
    if len(payload) != size or size < 9 or payload.startswith(_H2_PREFACE):
        return False
    i = 0
    while i < size:
        if i + 9 > size:
            return False
        length = int.from_bytes(payload[i : i + 3], "big")
        if payload[i + 3] not in _H2_CONTROL:
            return False
        i += 9 + length
    return i == size


def tcp_segments(path: Path) -> Iterator[tuple[int, dpkt.ip.IP, dpkt.tcp.TCP]]:
    """(capture time in ns, IP packet, TCP segment) of every TCP packet in a pcap (loopback, Linux
    cooked or Ethernet link type), in capture order; what does not parse is skipped."""
    import dpkt

    with open(path, "rb") as fh:
        reader = dpkt.pcap.Reader(fh)
        dlt = reader.datalink()
        for ts, buf in reader:
            try:
                if dlt in (dpkt.pcap.DLT_NULL, dpkt.pcap.DLT_LOOP):
                    ip = dpkt.loopback.Loopback(buf).data
                elif dlt == dpkt.pcap.DLT_LINUX_SLL:
                    ip = dpkt.sll.SLL(buf).data
                else:
                    ip = dpkt.ethernet.Ethernet(buf).data
                tcp = ip.data
            except (dpkt.UnpackError, AttributeError):
                continue
            if isinstance(tcp, dpkt.tcp.TCP):
                # a nanosecond capture gives a Decimal (exact); a microsecond one a float
                yield int(ts * 1_000_000_000), ip, tcp


def read_packets(path: Path) -> list[Packet]:
    """Data-carrying TCP packets of a pcap, in capture order."""
    out: list[Packet] = []
    for ts_ns, ip, tcp in tcp_segments(path):
        size = ip.len - ip.hl * 4 - tcp.off * 4 if hasattr(ip, "hl") else len(tcp.data)
        data = bytes(tcp.data)
        if size <= 0 or _h2_control_only(data, size):
            continue
        out.append(Packet(ts_ns, tcp.sport, tcp.dport, size, len(data) == size and is_stream_tail(data)))
    out.sort(key=lambda p: p.ts_ns)
    return out


# ------------------------------------------------------------------ per request


@dataclass(slots=True)
class LinkPorts:
    """One link, outermost port first: the ports a request passes (relays), ending at the inner hop's."""

    ports: list[int]
    inner: str  # "gw" (a pathprobe gateway), "srv" (the server), "silent" (reports nothing: nginx)


@dataclass(slots=True)
class Chain:
    """A configuration's links, client side first."""

    links: list[LinkPorts] = field(default_factory=list)


def _first(pkts: Sequence[Packet], dport: int, peers: Mapping[int, int]) -> int | None:
    peer = peers.get(dport)
    return next((p.ts_ns for p in pkts if p.dport == dport and (peer is None or p.sport == peer)), None)


def _last(pkts: Sequence[Packet], sport: int, peers: Mapping[int, int]) -> int | None:
    """The last response packet out of ``sport``, not counting an event stream's tail (unless that is
    all there is)."""
    peer = peers.get(sport)
    out = [p for p in pkts if p.sport == sport and (peer is None or p.dport == peer)]
    return next((p.ts_ns for p in reversed(out) if not p.tail), out[-1].ts_ns if out else None)


def connection_peers(windows: Iterable[Sequence[Packet]], ports: Iterable[int]) -> dict[int, int]:
    """For each listening port, the peer port seen in most request windows: the connection this
    configuration's requests use (kept alive across requests). Other connections on the same port --
    another gateway's health checks to the shared server, say -- are ignored."""
    from collections import Counter

    want = set(ports)
    counts: dict[int, Counter[int]] = {p: Counter() for p in want}
    for pkts in windows:
        seen: set[tuple[int, int]] = set()
        for p in pkts:
            if p.dport in want:
                seen.add((p.dport, p.sport))
            if p.sport in want:
                seen.add((p.sport, p.dport))
        for port, peer in seen:
            counts[port][peer] += 1
    return {port: c.most_common(1)[0][0] for port, c in counts.items() if c}


def window_peers(pkts: Sequence[Packet], ports: Iterable[int], usual: Mapping[int, int]) -> dict[int, int]:
    """The connection to follow on each port inside one request's window: the configuration's usual one
    (:func:`connection_peers`) when it carried data there, else the one that carried the most bytes
    (a proxy with a pool of upstream connections, such as nginx, picks one per request)."""
    out: dict[int, int] = {}
    for port in ports:
        volume: dict[int, int] = {}
        for p in pkts:
            if p.dport == port:
                volume[p.sport] = volume.get(p.sport, 0) + p.size
            elif p.sport == port:
                volume[p.dport] = volume.get(p.dport, 0) + p.size
        if not volume:
            continue
        peer = usual.get(port)
        out[port] = peer if peer in volume else max(volume, key=volume.__getitem__)
    return out


def _booked_waits(rec: RequestRecord) -> list[tuple[float, float]]:
    """Each reporting hop's waits for its loop as the record's split booked them, outermost first:
    (before its first timestamp, out of the link above it; after its upstream answered, ``upwait``,
    out of the link below it)."""
    split = rec.get("split")
    hops = split.get("hops") or () if split else ()
    return [(float(h.get("wait", 0.0)) - float(h.get("upwait", 0.0)), float(h.get("upwait", 0.0))) for h in hops]


def window_ends(pkts: Sequence[Packet], ports: Iterable[int], peers: Mapping[int, int]) -> dict[int, tuple[int, int]]:
    """Per port, (first request packet in, last response packet out) inside one request's window
    (concurrency 1: every packet there is the request's); a port without both is left out."""
    out: dict[int, tuple[int, int]] = {}
    for port in ports:
        first, last = _first(pkts, port, peers), _last(pkts, port, peers)
        if first is not None and last is not None:
            out[port] = (first, last)
    return out


def witness_request(
    rec: RequestRecord, pkts: Sequence[Packet], path: Chain, peers: Mapping[int, int] | None = None
) -> Section | None:
    """Wire and stack times (ms) per link for one request at concurrency 1; None when its packets are
    not all there. ``pkts``: the capture's data packets inside the request's window; ``peers``: the
    connection of each port to follow (:func:`connection_peers`)."""
    ports = [p for link in path.links for p in link.ports]
    return witness_ends(rec, window_ends(pkts, ports, peers or {}), path)


def witness_ends(rec: RequestRecord, ends: Mapping[int, tuple[int, int]], path: Chain) -> Section | None:
    """Wire and stack times (ms) per link for one request, from each port's (first request packet in,
    last response packet out); None when a port of the path has none."""
    t0 = int(rec["t0_wall_ns"])
    t_end = t0 + round(float(rec["e2e_ms"]) * 1e6)
    e = rec.get("entries") or {}
    ms = 1e-6
    links: list[Section] = []
    edges: list[tuple[int, int, int, int]] = []  # per link: (enter_req, arrive_req, leave_resp, exit_resp)
    for link in path.links:
        entry, inner = ends.get(link.ports[0]), ends.get(link.ports[-1])
        if entry is None or inner is None:
            return None
        edges.append((entry[0], inner[0], inner[1], entry[1]))
    booked = _booked_waits(rec)
    up_wait = 0.0  # the outer hop's wait after its upstream answered (the link's outer side)
    for i, (link, edge) in enumerate(zip(path.links, edges)):
        enter_req, arrive_req, leave_resp, exit_resp = edge
        wire = ((arrive_req - enter_req) + (exit_resp - leave_resp)) * ms
        # the outer side of the link: the client, or the hop before (its upstream side)
        if i == 0:
            outer = (
                (enter_req - t0) * ms
                - float(rec.get("client_encode_ms") or 0.0)
                + (t_end - exit_resp) * ms
                - float(rec.get("client_decode_ms") or 0.0)
            )
            outer_name = "client"
            # the client's wait for its own loop, as the split booked it (the client's, in ``other``):
            # it sits in the client's stack here
            sp = rec.get("split")
            outer_wait = float(sp.get("client_wait", 0.0)) if sp else 0.0
        else:
            outer_wait = 0.0
            prev = path.links[i - 1].inner
            window = (exit_resp - enter_req) * ms
            if prev == "gw":
                outer, outer_name = float(e.get("gw.upstream", 0.0)) - window, "gw.upstream"
                # the gateway's wait for its loop after the answer came, as the split booked it (its
                # queueing, out of this link): it sits in the gateway's stack here (``outer_wait``)
                outer_wait = up_wait
            else:  # a silent hop: its own time is reported apart (silent_hop), its upstream side is in it
                outer, outer_name = 0.0, "silent"
        # the inner side: packet window minus what the hop reports as its own (its total less a
        # stream's waits on its transport, <kind>.send: those are this side's stack, as the split has it)
        window_in = (leave_resp - arrive_req) * ms
        if link.inner in ("gw", "srv"):
            own = float(e.get(f"{link.inner}.total", 0.0)) - float(e.get(f"{link.inner}.send", 0.0))
            inner_stack, inner_name = window_in - own, link.inner
            # the hop's wait for its loop before its first timestamp, as the split booked it (the hop's
            # queueing, out of this link's network): it must fit in the hop's stack seen here
            hop_wait, up_wait = booked.pop(0) if booked else (0.0, 0.0)
        else:
            nxt = edges[i + 1] if i + 1 < len(edges) else None
            silent = (window_in - ((nxt[3] - nxt[0]) * ms)) if nxt else window_in
            inner_stack, inner_name = 0.0, "silent"
            links.append(
                {
                    "wire": wire,
                    "stack_outer": outer,
                    "outer": outer_name,
                    "stack_inner": inner_stack,
                    "inner": inner_name,
                    "silent_hop": silent,
                    "outer_wait": outer_wait,
                    "network": wire + outer + inner_stack + silent - outer_wait,
                }
            )
            continue
        links.append(
            {
                "wire": wire,
                "stack_outer": outer,
                "outer": outer_name,
                "stack_inner": inner_stack,
                "inner": inner_name,
                "hop_wait": hop_wait,
                "outer_wait": outer_wait,
                "network": wire + outer + inner_stack - hop_wait - outer_wait,
            }
        )
    return {"links": links}


def split_links(rec: Mapping[str, Any], path: Chain) -> list[float]:
    """The in-band split's network per link, in the same order (a silent hop's link and the one
    after it are one link for the split: its hop 1)."""
    sp = rec["split"]
    if len(path.links) == 1:
        return [float(sp["network_hop1"])]
    if path.links[0].inner == "silent":
        return [float(sp["network_hop1"])]
    return [float(sp["network_hop1"]), float(sp["network_hop2"])]


def analyze(records: Sequence[RequestRecord], packets: Sequence[Packet], path: Chain) -> Section:
    """Medians per link over the requests whose packets were all found: wire, each side's stack, the
    witness's network and the split's; ``matched`` / ``requests`` say how many were found."""
    import bisect

    times = [p.ts_ns for p in packets]
    ok = [r for r in records if r.get("ok") and r.get("split") and r.get("t0_wall_ns")]
    per: list[tuple[Section, list[float]]] = []
    windows = []
    for r in ok:
        t0 = int(r["t0_wall_ns"])
        t1 = t0 + round(float(r["e2e_ms"]) * 1e6)
        lo, hi = bisect.bisect_left(times, t0), bisect.bisect_right(times, t1)
        windows.append(packets[lo:hi])
    peers = connection_peers(windows, [p for link in path.links for p in link.ports])
    ports = [p for link in path.links for p in link.ports]
    for r, pkts in zip(ok, windows):
        w = witness_request(r, pkts, path, window_peers(pkts, ports, peers))
        if w is not None:
            per.append((w, split_links(r, path)))
    return _summary(len(ok), per, path)


def analyze_by_trace(
    records: Sequence[RequestRecord], by_trace: Mapping[str, Mapping[int, tuple[int, int]]], path: Chain
) -> Section:
    """:func:`analyze` at any concurrency: each request's packets found by its trace id
    (:func:`pathprobe.analysis.lab.wirestreams.requests_by_trace`), not by its time window.
    ``requests`` counts the records with a trace id (a record without one cannot be matched)."""
    ok = [r for r in records if r.get("ok") and r.get("split") and r.get("t0_wall_ns") and r.get("trace_id")]
    per: list[tuple[Section, list[float]]] = []
    for r in ok:
        ends = by_trace.get(str(r["trace_id"]))
        w = witness_ends(r, ends, path) if ends else None
        if w is not None:
            per.append((w, split_links(r, path)))
    out = _summary(len(ok), per, path)
    out["matched_by"] = "trace id"
    return out


def _summary(requests: int, per: list[tuple[Section, list[float]]], path: Chain) -> Section:
    out: Section = {"requests": requests, "matched": len(per), "links": []}
    if not per:
        return out
    n_split = len(per[0][1])
    for i in range(len(path.links)):
        keys = [k for k, v in per[0][0]["links"][i].items() if isinstance(v, float)]
        row: Section = {k: statistics.median(w["links"][i][k] for w, _ in per) for k in keys}
        row["outer"], row["inner"] = per[0][0]["links"][i]["outer"], per[0][0]["links"][i]["inner"]
        row["ports"] = path.links[i].ports
        # how far a booked wait overshoots the stack it comes out of (0 where it fits): its size, not
        # just how often (``wait_over``)
        for wait, stack in (("hop_wait", "stack_inner"), ("outer_wait", "stack_outer")):
            over = sorted(max(0.0, w["links"][i].get(wait, 0.0) - w["links"][i][stack]) for w, _ in per)
            row[f"{wait}_over_p50"], row[f"{wait}_over_p90"] = over[len(over) // 2], over[(len(over) * 9) // 10]
        out["links"].append(row)
    # the split's network per link (a silent hop merges links for the split: compared on the sum)
    if path.links[0].inner == "silent":
        wit = [statistics.median(sum(link["network"] for link in w["links"]) for w, _ in per)]
    else:
        wit = [statistics.median(w["links"][i]["network"] for w, _ in per) for i in range(n_split)]
    out["split_network"] = [statistics.median(s[i] for _, s in per) for i in range(n_split)]
    out["witness_network"] = wit
    neg: dict[str, int] = {}
    for w, _ in per:
        for i, link in enumerate(w["links"]):
            for side in ("stack_outer", "stack_inner"):
                if link[side] < NEGATIVE_MS:
                    neg[f"link{i}.{side}"] = neg.get(f"link{i}.{side}", 0) + 1
    out["negative_stacks"] = sum(
        1 for w, _ in per if any(min(link["stack_outer"], link["stack_inner"]) < NEGATIVE_MS for link in w["links"])
    )
    out["negative_by"] = neg
    out["wait_over"] = sum(
        1
        for w, _ in per
        if any(
            min(link["stack_inner"] - link.get("hop_wait", 0.0), link["stack_outer"] - link.get("outer_wait", 0.0))
            < NEGATIVE_MS
            for link in w["links"]
        )
    )
    return out
