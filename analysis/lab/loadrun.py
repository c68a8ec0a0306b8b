"""Load runs of a compare: one ``pathprobe load`` process per configuration and run (or one for
every configuration, its calls interleaved one by one), and what each run leaves behind
(records, the load generator's own health, accounting, the path's CPU)."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pathprobe import environment
from pathprobe.analysis.lab.accounting import Accounting
from pathprobe.analysis.lab.config import CompareConfig, Payload
from pathprobe.analysis.lab.paths import Path_
from pathprobe.analysis.lab.placement import Placement
from pathprobe.analysis.lab.procs import Managed, pathprobe_cmd
from pathprobe.jsontypes import JsonObject

if TYPE_CHECKING:
    import psutil
    from pathprobe.analysis.report.records import TaggedRecord


@dataclass
class RunResult:
    target: str
    concurrency: int
    round: int  # -1 = warm-up
    out_dir: Path
    records: list[TaggedRecord]
    duration_s: float
    error: str | None = None
    traces_file: str | None = None
    #: the load generator's own health in this run (summary.json's ``client`` block): event-loop
    #: lag, CPU, saturated; None for runs written before it existed
    client: JsonObject | None = None
    #: the run's requests counted at the client, the gateway and the server (accounting.json)
    accounting: Accounting | None = None
    #: CPU seconds (user + system) the path's own processes (gateway, proxy, relays; not the
    #: shared server) spent during this run; None for a path with none
    path_cpu_s: float | None = None
    #: the payload point of a sweep (None: the config's one size, as before sweeps)
    payload: Payload | None = None


def run_subdir(concurrency: int, payload: Payload | None) -> str:
    """A run's folder under ``runs/NAME/``: ``c4`` (one payload), ``c4-p4096-m16`` (a sweep's point)."""
    return f"c{concurrency}" if payload is None else f"c{concurrency}-{payload.key}"


def read_accounting(out_dir: Path) -> Accounting | None:
    try:
        return json.loads((out_dir / "accounting.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _family(procs: list[Managed]) -> Iterator[psutil.Process]:
    """The live processes among ``procs`` and all their children (nginx workers, LiteLLM's workers)."""
    import psutil

    for m in procs:
        if m.pid is None or m.exit_code() is not None:
            continue
        try:
            proc = psutil.Process(m.pid)
            yield from [proc, *proc.children(recursive=True)]
        except psutil.Error:
            continue


def cpu_seconds(procs: list[Managed]) -> float | None:
    """User + system CPU seconds of these processes and their children; None when there is no live
    process to read."""
    import psutil

    total, seen = 0.0, False
    for q in _family(procs):
        try:
            t = q.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
        seen = True
    return total if seen else None


def read_client(out_dir: Path) -> JsonObject | None:
    """The ``client`` block of a load run's summary.json (None when absent or unreadable)."""
    try:
        block = json.loads((out_dir / "summary.json").read_text(encoding="utf-8")).get("client")
    except (OSError, ValueError, AttributeError):
        return None
    return block if isinstance(block, dict) else None


def rss_bytes(procs: list[Managed]) -> int | None:
    """Resident memory (RSS) of these processes and their children, bytes; None when none is live."""
    import psutil

    total, seen = 0, False
    for q in _family(procs):
        try:
            total += q.memory_info().rss
        except psutil.Error:
            continue
        seen = True
    return total if seen else None


def read_path_cpu(run_dir: Path) -> float | None:
    """CPU seconds of the path's own processes in a run (path_cpu.json), None when absent."""
    try:
        return float(json.loads((run_dir / "path_cpu.json").read_text())["cpu_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def prepare_prompts(
    cfg: CompareConfig, out: Path, log: Callable[[str], None], tokens: int | None = None
) -> Path | None:
    """Cut the fixed/sweep prompts to exact token counts ONCE, into a prompt file (``tokens``: a
    payload sweep's prompt size, into ``prompts-p{tokens}.jsonl``; default the first size).

    Every ``pathprobe load`` would otherwise load the tokenizer (and import transformers:
    seconds per run on a busy 2-core box); with the file it starts with ``--tokenizer none``.
    Returns None (each run then cuts its own prompts) when the tokenizer cannot be loaded here.
    """
    L = cfg.load
    if L.prompt_set not in ("fixed", "sweep") or any(a.startswith(("--tokenizer", "--prompt")) for a in L.extra_args):
        return None
    spec = cfg.server.model if cfg.mode == "local" else "tiny"
    try:
        from pathprobe.models import prompts

        if L.prompt_set == "fixed":
            pset = prompts.cut("fixed", tokens=tokens or L.prompt_sizes[0], tokenizer=spec)
        else:
            pset = prompts.cut("sweep", tokenizer=spec)
    except Exception as exc:  # fall back to letting each run cut its prompts
        log(f"prompts: cutting them once failed ({type(exc).__name__}: {exc}); each load run will")
        return None
    path = out / ("prompts.jsonl" if tokens is None else f"prompts-p{tokens}.jsonl")
    with open(path, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps({"prompt": pr.text}) + "\n" for pr in pset.prompts)
    log(f"prompts: {len(pset.prompts)} {L.prompt_set} prompt(s) cut with the {spec!r} tokenizer -> {path}")
    return path


def run_load(
    cfg: CompareConfig,
    p: Path_,
    concurrency: int,
    rnd: int,
    duration_s: float,
    out_dir: Path,
    traces_file: Path | None,
    prompt_file: Path | None = None,
    placement: Placement | None = None,
    extra: list[str] | None = None,
    label: str | None = None,
    payload: Payload | None = None,
) -> RunResult:
    """One ``pathprobe load`` of path ``p`` for ``duration_s`` (rounded up to whole seconds) into
    ``out_dir``; its records tagged with the round and concurrency (``payload``: a sweep's point)."""
    secs = max(1, math.ceil(duration_s))
    point = f" {payload.key}" if payload is not None else ""
    label = label or f"{p.name} c={concurrency}{point} round={rnd}"
    args = load_command(cfg, p, concurrency, secs, out_dir, label, prompt_file, payload)
    if traces_file is not None:
        args += ["--traces-file", str(traces_file)]
    args += extra or []
    args += cfg.load.extra_args
    out_dir.mkdir(parents=True, exist_ok=True)
    log = out_dir / "load.log"
    code = _run_process(args, log, p.headers, placement, secs + cfg.load.timeout_s + 90)
    rec_path = out_dir / "records.jsonl"
    if not rec_path.exists():
        tail = " / ".join(log.read_text(errors="replace").strip().splitlines()[-5:])
        return RunResult(
            p.name,
            concurrency,
            rnd,
            out_dir,
            [],
            secs,
            f"pathprobe load exited with code {code} and wrote no records: {tail}",
            payload=payload,
        )
    return RunResult(
        p.name,
        concurrency,
        rnd,
        out_dir,
        _tagged_records(rec_path, rnd, concurrency),
        _duration_s(out_dir, secs),
        traces_file=str(traces_file) if traces_file else None,
        client=read_client(out_dir),
        payload=payload,
    )


def load_command(
    cfg: CompareConfig,
    p: Path_,
    concurrency: int,
    secs: int,
    out_dir: Path,
    label: str,
    prompt_file: Path | None,
    payload: Payload | None = None,
) -> list[str]:
    """``pathprobe load`` headless against ``p`` with the config's load settings (the prompts from
    ``prompt_file`` when given, already cut: no tokenizer needed; ``payload``: a sweep's point,
    default the config's first)."""
    L = cfg.load
    point = payload or L.payloads[0]
    if prompt_file is not None:
        prompt_args = ["--prompt-set", "file", "--prompt-file", str(prompt_file), "--tokenizer", "none"]
    else:
        prompt_args = ["--prompt-set", L.prompt_set, "--prompt-tokens", str(point.prompt_tokens)]
        if L.prompt_file:
            prompt_args += ["--prompt-file", L.prompt_file]
    args = pathprobe_cmd(
        "load",
        "--headless",
        "-H",
        p.url,
        "-u",
        str(concurrency),
        "-r",
        str(concurrency),
        "-t",
        f"{secs}s",
        "--out",
        str(out_dir),
        "--max-tokens",
        str(point.max_tokens),
        *prompt_args,
        "--timeout-s",
        str(L.timeout_s),
        "--only-summary",
        "--loglevel",
        "WARNING",
        "--exit-code-on-error",
        "0",
        "--stop-timeout",
        str(int(L.timeout_s)),
        "--label",
        label,
    )
    if L.stream:
        args.append("--stream")
    if L.arrival != "closed":
        args += ["--arrival", L.arrival, "--rate", str(L.rate)]
    if p.target.model and "--model" not in p.load_args:
        args += ["--model", p.target.model]
    if p.tls_ca:
        args += ["--target-ca", p.tls_ca]
    return args + p.load_args


def _run_process(
    args: list[str], log: Path, headers: dict[str, str], placement: Placement | None, timeout: float
) -> int:
    """Run the load to its end (its output into ``log``); its exit code, -1 when it was killed."""
    with open(log, "wb") as fh:
        # its own process group: on timeout or interruption the load AND its Locust child are ended
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if headers:
            env[environment.PATHPROBE_LOAD_HEADERS] = json.dumps(headers)
        proc = subprocess.Popen(
            args,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
            preexec_fn=placement.preexec("load") if placement else None,
        )
        try:
            return proc.wait(timeout=timeout)
        except BaseException:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            if not isinstance(sys.exc_info()[1], subprocess.TimeoutExpired):
                raise
            return -1


def _tagged_records(path: Path, rnd: int, concurrency: int) -> list[TaggedRecord]:
    from pathprobe.analysis.report.records import read_tagged

    return read_tagged(path, _round=rnd, _concurrency=concurrency)


def _duration_s(out_dir: Path, secs: int) -> float:
    """The run's measured duration (its summary.json), else the asked one."""
    summary = out_dir / "summary.json"
    if summary.exists():
        try:
            return float(json.loads(summary.read_text())["meta"].get("duration_s") or secs)
        except (ValueError, KeyError, TypeError):
            pass
    return float(secs)


MIXED = "_interleaved"  # runs/ folder of the call-by-call interleaved load runs


def interleavable(cfg: CompareConfig, paths: list[Path_]) -> bool:
    """Call-by-call interleaving applies when asked for and every configuration takes the same
    request (the same model name: one prompt stream serves them all)."""
    return (
        cfg.load.interleave == "call"
        and len(paths) > 1
        and len({p.target.model for p in paths}) == 1
        and _one_request(paths)
    )


def _one_request(paths: list[Path_]) -> bool:
    """No path needs its own headers or load arguments (e.g. LiteLLM: its route and key), or only
    one kind of them and every path speaks the OpenAI API (the same chat request, with a key the
    server of ours ignores, serves LiteLLM and the server's own OpenAI route alike)."""
    own = {(json.dumps(p.headers, sort_keys=True), tuple(p.load_args)) for p in paths if p.headers or p.load_args}
    return not own or (len(own) == 1 and all(p.target.protocol == "openai" for p in paths))


def run_load_mixed(
    cfg: CompareConfig,
    paths: list[Path_],
    concurrency: int,
    rnd: int,
    duration_s: float,
    out_root: Path,
    traces_file: Path | None,
    prompt_file: Path | None = None,
    placement: Placement | None = None,
    payload: Payload | None = None,
) -> dict[str, RunResult]:
    """One load process for every configuration of ``paths``: each user sends each call to the next
    configuration of a freshly shuffled order (``pathprobe load --mix``), so drift and CPU contention hit
    every configuration alike and calls pair up per cycle. Runs ``duration_s`` per configuration; the
    records are split per configuration into ``runs/NAME/c{C}/r{R}`` (``warmup`` for round -1) as a
    per-configuration run would have written them, with the shared run's summary.json."""
    sub = "warmup" if rnd < 0 else f"{run_subdir(concurrency, payload)}/r{rnd}"
    mixed_dir = out_root / MIXED / sub
    mix = ",".join(f"{p.name}={p.url}" for p in paths)
    extra = ["--mix", mix]
    lead = next((p for p in paths if p.headers or p.load_args), paths[0])  # its headers and arguments serve all
    ca = next((p.tls_ca for p in paths if p.tls_ca), "")  # one throw-away CA per run signs every TLS path
    if ca and not lead.tls_ca:
        extra += ["--target-ca", ca]
    res = run_load(
        cfg,
        lead,
        concurrency,
        rnd,
        duration_s * len(paths),
        mixed_dir,
        traces_file,
        prompt_file,
        placement,
        extra=extra,
        label=f"interleaved c={concurrency}{f' {payload.key}' if payload else ''} round={rnd}",
        payload=payload,
    )
    out: dict[str, RunResult] = {}
    by_name: dict[str, list[TaggedRecord]] = {p.name: [] for p in paths}
    for r in res.records:
        if r.get("config") in by_name:
            by_name[r["config"]].append(r)
    for p in paths:
        d = out_root / p.name / sub
        d.mkdir(parents=True, exist_ok=True)
        recs = by_name[p.name]
        with open(d / "records.jsonl", "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps({k: v for k, v in r.items() if not k.startswith("_")}) + "\n" for r in recs)
        if (mixed_dir / "summary.json").exists():
            shutil.copyfile(mixed_dir / "summary.json", d / "summary.json")
        out[p.name] = RunResult(
            p.name,
            concurrency,
            rnd,
            d,
            recs,
            res.duration_s / len(paths),
            error=res.error,
            traces_file=res.traces_file,
            client=res.client,
            payload=payload,
        )
    return out
