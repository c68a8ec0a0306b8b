"""GPU telemetry through NVML: temperature, SM clock, power, memory, throttle reasons.

:class:`GpuSampler` samples one GPU in a background thread while a run goes on, and
:func:`summarize` turns the samples into what a result carries (ranges, the throttle
reasons seen, and whether clocks were held down). NVML comes from ``nvidia-ml-py``
(module ``pynvml``), imported only when sampling starts; without it, or without an
NVIDIA GPU, the sampler reports ``{"gpu": False, "reason": "no GPU: ..."}`` instead of
numbers.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from types import ModuleType
from typing import Required, TypedDict

log = logging.getLogger(__name__)

#: NVML clock-event ("throttle") reason bits (nvml.h, nvmlClocksEventReason*)
REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
#: reasons that mean the clocks were held below what the load asked for
THROTTLING = 0x4 | 0x8 | 0x20 | 0x40 | 0x80
DEFAULT_INTERVAL_S = 0.2


@dataclass(slots=True)
class Sample:
    t: float  # seconds since the sampler started
    temperature_c: float
    sm_clock_mhz: float
    power_w: float
    memory_used_mib: float
    reasons: int  # bit mask, REASONS


class GpuDevice(TypedDict, total=False):
    """What NVML says of the card (empty until the sampler opened it)."""

    name: str
    driver: str
    memory_total_mib: float
    sm_clock_max_mhz: float


class Range(TypedDict):
    min: float
    median: float
    max: float


class GpuSummary(GpuDevice, total=False):
    """What a result carries: ``gpu`` False (with ``reason``) without a GPU, else the device and
    the samples' ranges."""

    gpu: Required[bool]
    reason: str
    samples: int
    seconds: float
    temperature_c: Range
    sm_clock_mhz: Range
    power_w: Range
    memory_used_mib: Range
    reasons_seen: list[str]
    throttled_share: float
    throttled: bool


def reason_names(mask: int) -> list[str]:
    return [name for bit, name in REASONS.items() if mask & bit]


def summarize(samples: Sequence[Sample], device: GpuDevice | None = None) -> GpuSummary:
    """What a result carries: ranges, reasons seen, throttled share of samples."""
    if not samples:
        empty = GpuSummary(gpu=True, samples=0)
        empty.update(device or {})
        return empty
    out = GpuSummary(gpu=True)
    out.update(device or {})

    def rng(key: str) -> Range:
        vals = [getattr(s, key) for s in samples]
        return {"min": min(vals), "median": statistics.median(vals), "max": max(vals)}

    seen = 0
    throttled = 0
    for s in samples:
        seen |= s.reasons
        throttled += bool(s.reasons & THROTTLING)
    out.update(
        {
            "samples": len(samples),
            "seconds": round(samples[-1].t - samples[0].t, 3),
            "temperature_c": rng("temperature_c"),
            "sm_clock_mhz": rng("sm_clock_mhz"),
            "power_w": rng("power_w"),
            "memory_used_mib": rng("memory_used_mib"),
            "reasons_seen": reason_names(seen),
            "throttled_share": throttled / len(samples),
            "throttled": bool(seen & THROTTLING),
        }
    )
    return out


def warning(summary: GpuSummary) -> str | None:
    """A one-line warning when clocks were throttled during the run, else None."""
    if not summary.get("throttled"):
        return None
    names = [n for n in summary.get("reasons_seen", []) if n in {REASONS[b] for b in REASONS if b & THROTTLING}]
    return (
        f"GPU clocks throttled in {100 * summary['throttled_share']:.0f}% of samples "
        f"({', '.join(names)}); SM clock "
        f"{summary['sm_clock_mhz']['min']:.0f}-{summary['sm_clock_mhz']['max']:.0f} MHz: "
        "timings from this run are slower than the card's normal speed"
    )


class GpuSampler:
    """Samples GPU ``index`` every ``interval_s`` in a daemon thread between start() and stop()."""

    def __init__(self, index: int = 0, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.index = index
        self.interval_s = interval_s
        self.samples: list[Sample] = []
        self.device: GpuDevice = {}
        self.unavailable: str | None = None
        self._nvml: ModuleType | None = None
        self._handle: object = None  # NVML's device handle
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0

    @property
    def available(self) -> bool:
        return self._handle is not None

    def _open(self) -> None:
        try:
            import pynvml
        except ImportError:
            self.unavailable = "no GPU: nvidia-ml-py (pynvml) is not installed"
            return
        try:
            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
            name = pynvml.nvmlDeviceGetName(handle)
            self.device = {
                "name": name.decode() if isinstance(name, bytes) else name,
                "driver": _text(pynvml.nvmlSystemGetDriverVersion()),
                "memory_total_mib": pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**20,
                "sm_clock_max_mhz": pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
            }
        except pynvml.NVMLError as exc:
            self.unavailable = f"no GPU: NVML: {exc}"
            return
        self._nvml, self._handle = pynvml, handle

    def sample(self) -> Sample | None:
        """One reading now (None without a GPU)."""
        if self._handle is None:
            return None
        nv, h = self._nvml, self._handle
        assert nv is not None
        reasons_fn = (
            getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        s = Sample(
            t=time.monotonic() - self._t0,
            temperature_c=float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
            sm_clock_mhz=float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
            power_w=nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
            memory_used_mib=nv.nvmlDeviceGetMemoryInfo(h).used / 2**20,
            reasons=int(reasons_fn(h)),
        )
        return s

    def start(self) -> GpuSampler:
        self._t0 = time.monotonic()
        self._open()
        if self._handle is None:
            log.info("GPU telemetry: %s", self.unavailable)
            return self
        self._thread = threading.Thread(target=self._run, name="pathprobe-nvml", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                s = self.sample()
            except Exception as exc:
                self.unavailable = f"NVML sampling stopped: {exc}"
                return
            if s is not None:
                self.samples.append(s)
            self._stop.wait(self.interval_s)

    def latest(self) -> Sample | None:
        return self.samples[-1] if self.samples else None

    def summary(self) -> GpuSummary:
        if self._handle is None:
            return {"gpu": False, "reason": self.unavailable or "no GPU"}
        return summarize(list(self.samples), self.device)

    def stop(self) -> GpuSummary:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        out = self.summary()
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
        msg = warning(out)
        if msg:
            log.warning(msg)
        return out


def _text(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def samples_as_dicts(samples: Sequence[Sample]) -> list[dict[str, float]]:
    return [asdict(s) for s in samples]
