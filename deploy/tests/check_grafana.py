#!/usr/bin/env python3
"""Checks deploy/grafana/shoal-dashboard.json (CTest deploy_grafana_dashboard): valid
JSON in the shape Grafana imports (title, uid, schemaVersion, panels with unique ids,
a datasource, targets and a place on the 24-column grid), only template variables it
defines or Grafana's own, and every metric its queries name exported by shoal
(docs/metrics.md) or recorded by deploy/prometheus/rules/shoal.rules.yml.

  check_grafana.py [DASHBOARD] [--print-exprs]
--print-exprs prints each query with the variables replaced (one per line), for
running them against a real Prometheus (deploy/tests/prometheus_test.py does).
"""
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "shoal-dashboard.json")
METRICS_DOC = os.path.join(ROOT, "docs", "metrics.md")
RULES = os.path.join(ROOT, "deploy", "prometheus", "rules", "shoal.rules.yml")

PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
                "unless", "offset", "bool", "inf", "nan"}
PROMETHEUS_OWN = {"up", "ALERTS", "ALERTS_FOR_STATE", "scrape_duration_seconds"}
GRAFANA_VARS = {"__rate_interval", "__interval", "__range", "__interval_ms", "__range_s"}


def metric_names(expr):
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)          # strings
    e = re.sub(r"\{[^}]*\}", "", e)                         # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)                        # ranges
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        tail = e[m.end():].lstrip()
        if tail.startswith("(") or m.group(0).lower() in PROMQL_WORDS:
            continue  # a function or keyword
        if m.start() > 0 and (e[m.start() - 1].isdigit() or e[m.start() - 1] == "."):
            continue  # exponent of a number
        names.add(m.group(0))
    return names


def documented():
    with open(METRICS_DOC) as f:
        doc = f.read()
    return set(re.findall(r"`((?:shoal|nv|process)_[a-z0-9_]+)", doc))


def recorded():
    with open(RULES) as f:
        return set(re.findall(r"record:\s*(\S+)", f.read()))


def substitute(expr):
    return (expr.replace("$__rate_interval", "1m").replace("$__interval", "15s")
            .replace("$model", ".*"))


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    path = args[0] if args else DASHBOARD
    errors = []
    with open(path) as f:
        try:
            d = json.load(f)
        except ValueError as e:
            print(f"ERROR: {path} is not valid JSON: {e}")
            return 1
    for key, kind in (("title", str), ("uid", str), ("schemaVersion", int), ("panels", list),
                      ("templating", dict)):
        if not isinstance(d.get(key), kind):
            errors.append(f"top level: {key} missing or not a {kind.__name__}")
    variables = {v["name"] for v in d.get("templating", {}).get("list", [])}
    exprs = []
    ids = set()
    panels = list(d.get("panels", []))
    for p in panels:
        panels.extend(p.get("panels", []))  # rows may hold panels
    for p in panels:
        where = f"panel {p.get('id')} {p.get('title')!r}"
        if p.get("id") in ids or not isinstance(p.get("id"), int):
            errors.append(f"{where}: id missing or not unique")
        ids.add(p.get("id"))
        g = p.get("gridPos", {})
        if not all(isinstance(g.get(k), int) for k in "xywh") or g["x"] + g["w"] > 24:
            errors.append(f"{where}: gridPos missing or off the 24-column grid")
        if not p.get("type") or not p.get("title"):
            errors.append(f"{where}: type and title required")
        if p.get("type") == "row":
            continue
        if p.get("datasource", {}).get("type") != "prometheus":
            errors.append(f"{where}: datasource is not Prometheus")
        if not p.get("targets"):
            errors.append(f"{where}: no targets")
        for t in p.get("targets", []):
            if not t.get("expr") or not t.get("refId"):
                errors.append(f"{where}: a target without expr or refId")
                continue
            exprs.append((where, t["expr"]))
    for v in d.get("templating", {}).get("list", []):
        q = v.get("query")
        if isinstance(q, dict) and "label_values(" in q.get("query", ""):
            inner = re.search(r"label_values\((.*),\s*\w+\)", q["query"]).group(1)
            exprs.append((f"variable {v['name']}", inner))
    known = documented() | recorded() | PROMETHEUS_OWN
    used = set()
    for where, expr in exprs:
        for var in re.findall(r"\$\{?(\w+)", expr):
            if var not in variables and var not in GRAFANA_VARS:
                errors.append(f"{where}: unknown variable ${var}")
        for name in metric_names(expr):
            used.add(name)
            family = re.sub(r"_(bucket|sum|count)$", "", name)
            if name not in known and family not in known:
                errors.append(f"{where}: metric {name} is neither in docs/metrics.md nor "
                              "recorded by deploy/prometheus")
    if "--print-exprs" in sys.argv:
        for _, expr in exprs:
            print(substitute(expr))
        return 1 if errors else 0
    for e in errors:
        print("ERROR:", e)
    print(f"{len(panels)} panels, {len(exprs)} queries, metrics: {', '.join(sorted(used))}")
    print("FAILED" if errors else "OK")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
