"""Print a payload sweep's figures from compare's report.json files as Markdown tables (the dated
result's): ``python bench/payload_summary.py out/payload-unary/report.json out/payload-stream/report.json``.
"""

from __future__ import annotations

import json
import sys


def _f(v: float | None, digits: int = 2) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def _hop(row: dict, outer: bool) -> dict | None:
    """The outermost hop (the proxy / gateway) or the innermost (the server)."""
    hops = row.get("hops") or []
    if not hops:
        return None
    return hops[0] if outer else hops[-1]


def table(report: dict) -> str:
    lines = [
        "| configuration | prompt | req KB | resp KB | n | e2e p50 | TTFT p50 | path tax p50 | client ms/MB "
        "| proxy hop ser ms (ms/MB) | server ser ms (ms/MB) | network per link ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|",
    ]
    rows = sorted(report["payload"]["rows"], key=lambda r: (r["target"], r["prompt_tokens"], r["max_tokens"]))
    for r in rows:
        outer, inner = _hop(r, True), _hop(r, False)
        proxy = (
            f"{_f(outer['serialization_mean_ms'], 3)} ({_f(outer['ms_per_mb'])})"
            if outer and outer is not inner and outer["label"] != "server"
            else "– (reports nothing)"
        )
        srv = f"{_f(inner['serialization_mean_ms'], 3)} ({_f(inner['ms_per_mb'])})" if inner else "–"
        links = " / ".join(_f(link["mean_ms"], 2) for link in r.get("links") or [])
        kb = (r.get("request_bytes") or 0) / 1e3, (r.get("response_bytes") or 0) / 1e3
        lines.append(
            f"| {r['target']} | {r['prompt_tokens']} | {kb[0]:.1f} | {kb[1]:.1f} | {r['n']} | {_f(r['e2e_p50'])} "
            f"| {_f(r.get('ttft_p50'))} | {_f(r['path_tax_p50'])} | {_f(r.get('client_ms_per_mb'))} | {proxy} "
            f"| {srv} | {links} |"
        )
    return "\n".join(lines)


def limits(report: dict) -> str:
    lines = ["| where | setting | value | why |", "|---|---|---|---|"]
    lines += [f"| {x['where']} | {x['setting']} | {x['value']} | {x['why']} |" for x in report["payload"]["limits"]]
    return "\n".join(lines)


def main() -> None:
    for i, path in enumerate(sys.argv[1:]):
        with open(path, encoding="utf-8") as fh:
            report = json.load(fh)
        stream = report["method"].get("stream")
        print(f"### {'streamed' if stream else 'unary'} ({path})\n")
        print(table(report) + "\n")
        if i == 0:
            print("### Limits set for the largest payload\n")
            print(limits(report) + "\n")


if __name__ == "__main__":
    main()
