"""Live view in Locust's web UI.

- A "Segments" tab (Locust's extendedTabs/extendedTables mechanism): per route, the
  p50/p95/p99 of e2e, each segment, TTFT and ITL, refreshed with Locust's own stats poll.
- ``/pathprobe``: a page with stacked segment bars per route (p50/p95/p99) and TTFT/ITL,
  polling ``/pathprobe/data`` every 2 s (linked from the "Download Data" tab).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flask import Response
    from locust.env import Environment
    from pathprobe.loadgen.records import Summary
    from pathprobe.loadgen.runtime import Runtime

TAB_KEY = "pathprobe"
COLUMNS = ("e2e", "network", "serialization", "queueing", "inference", "other", "ttft", "itl")


def rows(summary: Summary) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    for route, rs in summary.get("routes", {}).items():
        for pct in ("p50", "p95", "p99"):
            row: dict[str, str] = {"route": f"{route} ({rs['ok']} ok / {rs['errors']} err)", "pct": pct}
            for m in COLUMNS:
                st = rs["metrics"].get(m) or {}
                v = st.get(pct)
                row[m] = f"{v:.3f}" if isinstance(v, (int, float)) else ""
            out.append(row)
    return out


def install(environment: Environment, rt: Runtime) -> None:
    from flask import Response, request

    web_ui = environment.web_ui
    if web_ui is None or web_ui.app is None:  # called only with a web UI (listeners checks)
        return
    app = web_ui.app
    web_ui.template_args["extendedTabs"] = [{"title": "Segments (pathprobe)", "key": TAB_KEY}]
    web_ui.template_args["extendedTables"] = [
        {
            "key": TAB_KEY,
            "structure": [{"key": "route", "title": "Route"}, {"key": "pct", "title": "pct"}]
            + [{"key": m, "title": f"{m} ms"} for m in COLUMNS],
        }
    ]
    web_ui.template_args["extendedCsvFiles"] = [
        {"href": "./pathprobe", "title": "pathprobe: live stacked segment view"},
        {"href": "./pathprobe/data", "title": "pathprobe: summary JSON (current)"},
    ]

    def current() -> Summary:
        if rt.role == "local":
            rt.agg.flush(rt.writer)
        return rt.agg.summary(rt.meta())

    @app.after_request
    def _extend_stats(response: Response) -> Response:
        if request.path.endswith("/stats/requests") and response.is_json:
            try:
                data = response.get_json()
                data["extendedStats"] = [{"key": TAB_KEY, "data": rows(current())}]
                response.set_data(json.dumps(data))
            except Exception:
                pass
        return response

    @app.route("/pathprobe/data")
    def _pathprobe_data() -> Response:
        return Response(json.dumps(current()), mimetype="application/json")

    @app.route("/pathprobe")
    def _pathprobe_page() -> Response:
        return Response(PAGE, mimetype="text/html")


PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>pathprobe: live segment split</title>
<style>
body{font-family:system-ui,sans-serif;margin:20px;background:#fafafa;color:#222}
h2{margin:18px 0 4px} .bar{display:flex;height:22px;margin:3px 0;border:1px solid #ccc;background:#fff}
.bar div{height:100%} .row{display:flex;align-items:center;gap:8px} .lbl{width:70px;font-size:13px}
.val{font-size:12px;color:#555;white-space:nowrap} .legend span{display:inline-block;margin-right:14px;font-size:13px}
.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:middle}
table{border-collapse:collapse;font-size:13px;margin-top:6px} td,th{border:1px solid #ddd;padding:2px 8px;text-align:right}
</style></head><body>
<h1>pathprobe: where the milliseconds go</h1>
<div class="legend" id="legend"></div>
<p style="font-size:12px;color:#666">Each bar stacks the per-segment percentile (network, serialization,
queueing, inference, other); the figure at the end is the e2e percentile. Refreshes every 2 s.</p>
<div id="routes">waiting for data...</div>
<script>
const SEG=["network","serialization","queueing","inference","other"];
const COL={network:"#4e79a7",serialization:"#f28e2b",queueing:"#e15759",inference:"#59a14f",other:"#9c9c9c"};
document.getElementById("legend").innerHTML=SEG.map(s=>`<span><i style="background:${COL[s]}"></i>${s}</span>`).join("");
function f(v){return v===undefined||v===null?"-":v.toFixed(3)}
async function tick(){
  try{
    const r=await fetch("./pathprobe/data"); const s=await r.json(); let html="";
    for(const [route,rs] of Object.entries(s.routes||{})){
      const m=rs.metrics||{}; let maxv=0;
      for(const p of ["p50","p95","p99"]){let t=0;for(const g of SEG){t+=(m[g]||{})[p]||0}maxv=Math.max(maxv,t,(m.e2e||{})[p]||0)}
      html+=`<h2>${route}</h2><div style="font-size:13px">${rs.requests} requests, ${rs.ok} ok, ${rs.errors} errors</div>`;
      for(const p of ["p50","p95","p99"]){
        let segs="";for(const g of SEG){const v=Math.max(0,(m[g]||{})[p]||0);segs+=`<div title="${g} ${f(v)} ms" style="width:${maxv?100*v/maxv:0}%;background:${COL[g]}"></div>`}
        html+=`<div class="row"><span class="lbl">${p}</span><div class="bar" style="flex:1">${segs}</div><span class="val">e2e ${f((m.e2e||{})[p])} ms</span></div>`;
      }
      html+="<table><tr><th>ms</th><th>p50</th><th>p95</th><th>p99</th><th>max</th></tr>";
      for(const k of ["e2e","ttft","itl","tpot","schedule_lag"]){const v=m[k];if(!v||!v.count)continue;
        html+=`<tr><td>${k}</td><td>${f(v.p50)}</td><td>${f(v.p95)}</td><td>${f(v.p99)}</td><td>${f(v.max)}</td></tr>`}
      html+="</table>";
    }
    document.getElementById("routes").innerHTML=html||"no requests yet";
  }catch(e){document.getElementById("routes").textContent="error: "+e}
}
tick(); setInterval(tick,2000);
</script></body></html>
"""
