"""The load generator's spans survive Locust killing its users at a test's end.

Spans are exported by the users themselves, between two requests (:meth:`Tracing.drain`). Locust stops
a test by killing its users at once, and a user killed while its export waited for the collector's
answer dropped the batch it had taken: the distributed compose test missed its last request's span in
about one run of sixteen. Here a real OTLP exporter, made cooperative under gevent as in a Locust
process, sends to a real receiver that answers each export late; each case runs in a process of its
own and must deliver every span, once, or say how many it could not.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.support.otlp import OTLPReceiver

# a Locust process's tracing: gevent, grpc made cooperative, a real OTLP exporter (argv[1]), `spans`
# finished spans waiting for the next drain
_PREAMBLE = """
import sys
import time

from gevent import monkey

monkey.patch_all()
from grpc.experimental import gevent as grpc_gevent

grpc_gevent.init_gevent()
import gevent
from pathprobe import telemetry
from pathprobe.loadgen.tracing import SPAN_SLICE, Tracing

provider = telemetry.setup_tracing("pathprobe-loadgen", otlp_endpoint=sys.argv[1], set_global=False, deferred=True)
tracing = Tracing(provider.get_tracer("t"), provider, telemetry.deferred_processors(provider))
for n in range(int(sys.argv[2])):
    tracing.tracer.start_span(f"request-{n}").end()
pause = lambda: gevent.sleep(0)  # the periodic flush's pause between slices
"""

# a user exporting is killed while its export waits for the collector; the test's end sends the rest
_KILLED = """
user = gevent.spawn(tracing.drain, pause)  # a user's flush between two requests
gevent.sleep(0.1)  # its export now waits for the collector's answer
assert not user.dead, "the export did not wait"
user.kill()  # Locust stops the test
tracing.shutdown()  # the test's end (test_stop)
"""

# Two flushes overlap: the second takes what the first counted on while the first's export waits. The
# first must end with the queue empty (it once waited for spans that would never come, for ever, and
# the test's end, which waits for every export under way, hung: a worker never sent its final batch
# and the master's summary counted no worker).
_OVERLAP = """
first = gevent.spawn(tracing.drain, pause)  # takes one slice, then waits for the collector
gevent.sleep(0.1)
assert len(tracing.deferred[0].pending) == int(sys.argv[2]) - SPAN_SLICE
second = gevent.spawn(tracing.drain, pause)  # another user's flush takes the rest
gevent.joinall([first, second], timeout=10)
assert first.dead and second.dead, "a drain is still waiting for spans another drain took"
with gevent.Timeout(10):
    tracing.shutdown()
"""

# A collector that does not answer holds the test's end back only so long: a worker sends its final
# batch after its spans, and the master waits for that batch only ``stop_timeout`` + 30 s.
_STUCK = """
t0 = time.monotonic()
done = tracing.shutdown(timeout_s=1.0)
print(done, round(time.monotonic() - t0, 2))
"""


def _run(body: str, spans: int, delay_s: float) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """``body`` after the preamble, against a receiver that answers ``delay_s`` late; the names received."""
    receiver = OTLPReceiver(delay_s=delay_s).start()
    try:
        run = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(_PREAMBLE + body), receiver.endpoint, str(spans)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        names = sorted(sp.name for _, sp in receiver.spans)
    finally:
        receiver.stop()
    assert run.returncode == 0, run.stderr[-3000:]
    return run, names


def test_a_user_killed_while_exporting_loses_no_span() -> None:
    # shutdown() returns once every export was answered: nothing is still on its way
    _, names = _run(_KILLED, 5, 0.3)
    assert names == [f"request-{n}" for n in range(5)], names


def test_overlapping_drains_end_and_export_every_span_once() -> None:
    _, names = _run(_OVERLAP, 40, 0.3)
    assert names == sorted(f"request-{n}" for n in range(40)), names


def test_the_test_end_waits_for_an_unanswering_collector_only_so_long() -> None:
    run, _ = _run(_STUCK, 3, 8.0)
    done, waited = run.stdout.split()
    assert done == "False" and 0.9 <= float(waited) < 4.0, run.stdout
