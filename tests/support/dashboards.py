"""Check Grafana dashboards and alert rules against what processes really export.

Every PromQL expression (panel targets, template variable queries, alert rule queries) is
parsed with a real PromQL parser; each metric it selects must be a sample name on a live
``/metrics`` page, each label it matches or groups by must exist on those samples, and each
equality-matched label value must occur there. A renamed metric, label or segment fails.
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import promql_parser
from prometheus_client.parser import text_string_to_metric_families

#: labels Prometheus adds to every scraped series
TARGET_LABELS = {"instance", "job"}
#: Grafana's built-in interval variables and what they stand for when parsing
BUILTINS = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "5m"}
_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("_sum", "_count", ""),
    "gauge": ("",),
}
_LABEL_VALUES = re.compile(r"^label_values\(\s*(?P<expr>.+?)\s*,\s*(?P<label>\w+)\s*\)$")


@dataclass
class Exported:
    """Sample name -> label names, and (sample, label) -> values seen, from /metrics pages."""

    labels: dict[str, set[str]] = field(default_factory=dict)
    values: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    #: sample names of families declared (HELP/TYPE) with no sample yet: a labelled counter
    #: nothing has incremented (e.g. upstream errors); their labels cannot be checked
    unobserved: set[str] = field(default_factory=set)

    def add_text(self, text: str) -> None:
        for fam in text_string_to_metric_families(text):
            if not fam.samples:
                self.unobserved.update(fam.name + sfx for sfx in _SUFFIXES.get(fam.type, ("",)))
            for s in fam.samples:
                self.labels.setdefault(s.name, set()).update(s.labels)
                for k, v in s.labels.items():
                    self.values.setdefault((s.name, k), set()).add(v)

    def add_url(self, url: str) -> None:
        with urllib.request.urlopen(url, timeout=5) as resp:
            self.add_text(resp.read().decode())


@dataclass
class Selector:
    metric: str
    matchers: list[tuple[str, str, str]]  # (label, op, value)


def _walk(node: Any, selectors: list[Selector], groupings: list[tuple[set[str], list[Selector]]]) -> None:
    if node is None:
        return
    if isinstance(node, promql_parser.VectorSelector):
        matchers = [(m.name, str(m.op), m.value) for m in node.matchers.matchers]
        selectors.append(Selector(node.name or "", matchers))
        return
    if isinstance(node, promql_parser.MatrixSelector):
        _walk(node.vector_selector, selectors, groupings)
        return
    if isinstance(node, promql_parser.AggregateExpr):
        inner: list[Selector] = []
        _walk(node.expr, inner, groupings)
        if node.modifier is not None and node.modifier.labels:
            groupings.append((set(node.modifier.labels), inner))
        selectors.extend(inner)
        _walk(node.param, selectors, groupings)
        return
    if isinstance(node, promql_parser.Call):
        for a in node.args:
            _walk(a, selectors, groupings)
        return
    for attr in ("lhs", "rhs", "expr"):
        if hasattr(node, attr):
            _walk(getattr(node, attr), selectors, groupings)


def substitute(expr: str, variables: dict[str, str]) -> str:
    for name, value in {**BUILTINS, **variables}.items():
        expr = expr.replace(name, value)
    return expr


def check_expr(where: str, expr: str, exported: Exported) -> list[str]:
    """Problems with one PromQL expression (empty when every name and label is exported)."""
    try:
        ast = promql_parser.parse(expr)
    except Exception as exc:
        return [f"{where}: does not parse: {exc}: {expr}"]
    selectors: list[Selector] = []
    groupings: list[tuple[set[str], list[Selector]]] = []
    _walk(ast, selectors, groupings)
    problems = []
    if not selectors:
        problems.append(f"{where}: selects no metric: {expr}")
    for sel in selectors:
        if sel.metric in exported.unobserved and sel.metric not in exported.labels:
            continue  # declared, nothing counted yet: the name is right, labels unknown
        if sel.metric not in exported.labels:
            problems.append(f"{where}: metric {sel.metric!r} is not exported")
            continue
        have = exported.labels[sel.metric] | TARGET_LABELS
        for label, op, value in sel.matchers:
            if label not in have:
                problems.append(f"{where}: {sel.metric} has no label {label!r} (has {sorted(have)})")
            elif "Equal" in op and "Not" not in op and label not in TARGET_LABELS:
                seen = exported.values.get((sel.metric, label), set())
                if value not in seen:
                    problems.append(f"{where}: {sel.metric}{{{label}={value!r}}} never seen (values: {sorted(seen)})")
    for labels, inner in groupings:
        have = set(TARGET_LABELS)
        if any(sel.metric in exported.unobserved for sel in inner):
            continue
        for sel in inner:
            have |= exported.labels.get(sel.metric, set())
        for label in sorted(labels - have):
            problems.append(f"{where}: groups by {label!r}, which none of its metrics has")
    return problems


def dashboard_variables(dash: dict[str, Any]) -> dict[str, str]:
    """Template variables as a regex that matches anything (they sit in =~ matchers)."""
    return {f"${v['name']}": ".*" for v in dash.get("templating", {}).get("list", [])}


def check_dashboard(dash: dict[str, Any], exported: Exported, datasource_uids: set[str]) -> list[str]:
    problems: list[str] = []
    variables = dashboard_variables(dash)
    panels = list(dash.get("panels", []))
    if not panels:
        problems.append("dashboard has no panels")
    for panel in panels:
        where = f"panel {panel.get('title')!r}"
        ds = (panel.get("datasource") or {}).get("uid")
        if ds not in datasource_uids:
            problems.append(f"{where}: datasource uid {ds!r} is not provisioned ({sorted(datasource_uids)})")
        targets = panel.get("targets") or []
        if not targets:
            problems.append(f"{where}: no targets")
        for t in targets:
            if "expr" not in t:
                problems.append(f"{where} target {t.get('refId')}: no expr")
                continue
            problems += check_expr(f"{where} target {t.get('refId')}", substitute(t["expr"], variables), exported)
    for var in dash.get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        q = var["query"]["query"] if isinstance(var.get("query"), dict) else var.get("query", "")
        m = _LABEL_VALUES.match(q)
        if not m:
            problems.append(f"variable {var['name']}: query {q!r} is not label_values(EXPR, LABEL)")
            continue
        where = f"variable {var['name']}"
        problems += check_expr(where, m["expr"], exported)
        metric = m["expr"].split("{")[0].strip()
        if m["label"] not in exported.labels.get(metric, set()):
            problems.append(f"{where}: {metric} has no label {m['label']!r}")
    return problems


def check_alert_rules(doc: dict[str, Any], exported: Exported, datasource_uids: set[str]) -> list[str]:
    """Grafana alerting provisioning: queries export-checked, expression refs consistent."""
    problems: list[str] = []
    rules = [r for g in doc.get("groups", []) for r in g.get("rules", [])]
    if not rules:
        problems.append("no alert rules")
    for rule in rules:
        where = f"rule {rule.get('title')!r}"
        data = rule.get("data") or []
        refs = {d.get("refId") for d in data}
        if rule.get("condition") not in refs:
            problems.append(f"{where}: condition {rule.get('condition')!r} names no query ({sorted(refs)})")
        for d in data:
            model = d.get("model") or {}
            if d.get("datasourceUid") == "__expr__":
                if model.get("expression") not in refs:
                    problems.append(f"{where} {d.get('refId')}: expression {model.get('expression')!r} names no query")
            elif d.get("datasourceUid") not in datasource_uids:
                problems.append(f"{where} {d.get('refId')}: datasource {d.get('datasourceUid')!r} is not provisioned")
            elif "expr" not in model:
                problems.append(f"{where} {d.get('refId')}: no expr")
            else:
                problems += check_expr(f"{where} {d.get('refId')}", model["expr"], exported)
    return problems


def thresholds(doc: dict[str, Any]) -> Iterable[tuple[str, str, float]]:
    """(rule title, evaluator type, value) of every threshold expression."""
    for g in doc.get("groups", []):
        for rule in g.get("rules", []):
            for d in rule.get("data") or []:
                model = d.get("model") or {}
                if model.get("type") == "threshold":
                    for c in model.get("conditions", []):
                        ev = c["evaluator"]
                        yield rule["title"], ev["type"], float(ev["params"][0])
