#!/usr/bin/env python3
"""Offline schema and consistency check of deploy/kubernetes (CTest
deploy_kubernetes_manifests).

Renders the base and every overlay with `kubectl kustomize` (no cluster needed) and
checks each object against a small schema of the kinds used here (Deployment, Service,
HorizontalPodAutoscaler, PodDisruptionBudget): known apiVersion, required fields, field
types, no unknown fields (a misspelt `readinesProbe` would otherwise be dropped silently
by the API server), quantities that parse. Then what the objects promise each other: the
selectors match the pod labels, probe and Service ports name container ports, liveness
is /v2/health/live and readiness /v2/health/ready, the grace period outlasts preStop and
the drain, requests do not exceed limits, the HPA targets the Deployment, and every
`--flag` given to `shoal serve` is one that `shoal serve --help` lists.

  check_kubernetes.py [--kubectl kubectl] [--shoal build/src/cli/shoal] [DIR...]
"""
import argparse
import os
import re
import subprocess
import sys

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
KUBE = os.path.join(os.path.dirname(HERE), "kubernetes")

# --- schema ----------------------------------------------------------------------------
# A spec is a type (str, int, bool), "quantity", "intorstr", a dict {field: spec} whose
# required fields end in "!", [spec] for a list, or {"*": spec} for a free map.
LABELS = {"*": str}
META = {"name!": str, "namespace": str, "labels": LABELS, "annotations": LABELS}
SELECTOR = {"matchLabels": LABELS, "matchExpressions": [{"key!": str, "operator!": str,
                                                          "values": [str]}]}
HTTP_GET = {"path!": str, "port!": "intorstr", "scheme": str}
PROBE = {"httpGet": HTTP_GET, "tcpSocket": {"port!": "intorstr"}, "grpc": {"port!": int},
         "exec": {"command!": [str]}, "initialDelaySeconds": int, "periodSeconds": int,
         "timeoutSeconds": int, "failureThreshold": int, "successThreshold": int}
RESOURCES = {"requests": {"*": "quantity"}, "limits": {"*": "quantity"}}
CONTAINER = {
    "name!": str, "image!": str, "imagePullPolicy": str, "command": [str], "args": [str],
    "env": [{"name!": str, "value": str}],
    "ports": [{"name": str, "containerPort!": int, "protocol": str}],
    "livenessProbe": PROBE, "readinessProbe": PROBE, "startupProbe": PROBE,
    "lifecycle": {"preStop": {"exec": {"command!": [str]}, "httpGet": HTTP_GET}},
    "resources": RESOURCES,
    "securityContext": {"allowPrivilegeEscalation": bool, "readOnlyRootFilesystem": bool,
                        "runAsNonRoot": bool, "runAsUser": int, "runAsGroup": int,
                        "capabilities": {"drop": [str], "add": [str]}},
    "volumeMounts": [{"name!": str, "mountPath!": str, "readOnly": bool}],
}
POD_SPEC = {
    "containers!": [CONTAINER], "terminationGracePeriodSeconds": int,
    "securityContext": {"runAsNonRoot": bool, "runAsUser": int, "runAsGroup": int,
                        "fsGroup": int},
    "volumes": [{"name!": str, "emptyDir": {"medium": str, "sizeLimit": "quantity"},
                 "persistentVolumeClaim": {"claimName!": str, "readOnly": bool},
                 "configMap": {"name!": str}}],
    "topologySpreadConstraints": [{"maxSkew!": int, "topologyKey!": str,
                                   "whenUnsatisfiable!": str, "labelSelector": SELECTOR}],
    "nodeSelector": LABELS, "serviceAccountName": str,
}
SCHEMAS = {
    ("apps/v1", "Deployment"): {
        "apiVersion!": str, "kind!": str, "metadata!": META,
        "spec!": {"replicas": int, "selector!": SELECTOR,
                  "strategy": {"type": str, "rollingUpdate": {"maxSurge": "intorstr",
                                                              "maxUnavailable": "intorstr"}},
                  "template!": {"metadata!": {"labels!": LABELS, "annotations": LABELS},
                                "spec!": POD_SPEC}}},
    ("v1", "Service"): {
        "apiVersion!": str, "kind!": str, "metadata!": META,
        "spec!": {"type": str, "selector!": LABELS,
                  "ports!": [{"name": str, "port!": int, "targetPort": "intorstr",
                              "protocol": str, "appProtocol": str}]}},
    ("autoscaling/v2", "HorizontalPodAutoscaler"): {
        "apiVersion!": str, "kind!": str, "metadata!": META,
        "spec!": {
            "scaleTargetRef!": {"apiVersion": str, "kind!": str, "name!": str},
            "minReplicas": int, "maxReplicas!": int,
            "metrics": [{"type!": str,
                         "pods": {"metric!": {"name!": str, "selector": SELECTOR},
                                  "target!": {"type!": str, "averageValue": "quantity"}},
                         "resource": {"name!": str,
                                      "target!": {"type!": str, "averageUtilization": int,
                                                  "averageValue": "quantity"}},
                         "object": {"metric!": {"name!": str},
                                    "describedObject!": {"apiVersion": str, "kind!": str,
                                                         "name!": str},
                                    "target!": {"type!": str, "value": "quantity",
                                                "averageValue": "quantity"}}}],
            "behavior": {d: {"stabilizationWindowSeconds": int, "selectPolicy": str,
                             "policies": [{"type!": str, "value!": int, "periodSeconds!": int}]}
                         for d in ("scaleUp", "scaleDown")}}},
    ("policy/v1", "PodDisruptionBudget"): {
        "apiVersion!": str, "kind!": str, "metadata!": META,
        "spec!": {"minAvailable": "intorstr", "maxUnavailable": "intorstr",
                  "selector!": SELECTOR}},
}
QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$")
SUFFIX = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def quantity(q):
    q = str(q)
    m = re.match(r"^([+-]?[\d.]+(?:[eE][+-]?\d+)?)([A-Za-z]*)$", q)
    return float(m.group(1)) * SUFFIX[m.group(2)]


def check_schema(value, spec, path, errors):
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            errors.append(f"{path}: expected a mapping, got {type(value).__name__}")
            return
        if "*" in spec:
            for k, v in value.items():
                check_schema(v, spec["*"], f"{path}.{k}", errors)
            return
        fields = {k.rstrip("!"): s for k, s in spec.items()}
        for k in spec:
            if k.endswith("!") and k[:-1] not in value:
                errors.append(f"{path}: required field {k[:-1]} missing")
        for k, v in value.items():
            if k not in fields:
                errors.append(f"{path}: unknown field {k}")
            else:
                check_schema(v, fields[k], f"{path}.{k}", errors)
    elif isinstance(spec, list):
        if not isinstance(value, list):
            errors.append(f"{path}: expected a list, got {type(value).__name__}")
            return
        for i, v in enumerate(value):
            check_schema(v, spec[0], f"{path}[{i}]", errors)
    elif spec == "quantity":
        if isinstance(value, bool) or not QUANTITY.match(str(value)):
            errors.append(f"{path}: {value!r} is not a quantity")
    elif spec == "intorstr":
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            errors.append(f"{path}: {value!r} is neither an integer nor a string")
    elif spec is int:
        if isinstance(value, bool) or not isinstance(value, int):
            errors.append(f"{path}: {value!r} is not an integer")
    elif not isinstance(value, spec):
        errors.append(f"{path}: {value!r} is not a {spec.__name__}")


# --- what the objects promise each other -------------------------------------------------
def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_consistency(objs, where, serve_flags, errors):
    def e(msg):
        errors.append(f"{where}: {msg}")
    by_kind = {}
    for o in objs:
        by_kind.setdefault(o["kind"], []).append(o)
    for kind in ("Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"):
        if kind not in by_kind:
            e(f"no {kind}")
    namespaces = {o["metadata"].get("namespace") for o in objs}
    if len(namespaces) != 1:
        e(f"objects in several namespaces: {namespaces}")
    deployments = {d["metadata"]["name"]: d for d in by_kind.get("Deployment", [])}
    for d in deployments.values():
        name = d["metadata"]["name"]
        spec, pod = d["spec"], d["spec"]["template"]["spec"]
        labels = d["spec"]["template"]["metadata"]["labels"]
        if not selects(spec["selector"].get("matchLabels"), labels):
            e(f"Deployment {name}: selector does not match the pod template's labels")
        c = next((c for c in pod["containers"] if c["name"] == "shoal"), None)
        if c is None:
            e(f"Deployment {name}: no container named shoal")
            continue
        ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
        for p in c.get("ports", []):
            if not 0 < p["containerPort"] < 65536:
                e(f"container port {p['containerPort']} out of range")
            if p.get("name") and len(p["name"]) > 15:
                e(f"port name {p['name']} longer than 15 characters")
        for probe, want in (("livenessProbe", "/v2/health/live"),
                            ("readinessProbe", "/v2/health/ready")):
            g = c.get(probe, {}).get("httpGet")
            if not g:
                e(f"Deployment {name}: no {probe} httpGet")
                continue
            if g["path"] != want:
                e(f"Deployment {name}: {probe} on {g['path']}, expected {want}")
            if isinstance(g["port"], str) and g["port"] not in ports:
                e(f"Deployment {name}: {probe} port {g['port']} is no container port")
        args = c.get("args", [])
        flag_values = dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)
        if args[:1] != ["serve"]:
            e(f"Deployment {name}: args do not start with serve: {args}")
        for a in args[1:]:
            if not a.startswith("--") or "=" not in a:
                e(f"Deployment {name}: argument {a!r} is not --flag=value")
            elif serve_flags is not None and a[2:].split("=", 1)[0] not in serve_flags:
                e(f"Deployment {name}: `shoal serve` has no option --{a[2:].split('=', 1)[0]}")
        for flag, port_name in (("http-port", "http"), ("grpc-port", "grpc"),
                                ("metrics-port", "metrics")):
            if str(ports.get(port_name)) != flag_values.get(flag):
                e(f"Deployment {name}: --{flag}={flag_values.get(flag)} but container port "
                  f"{port_name} is {ports.get(port_name)}")
        ann = d["spec"]["template"]["metadata"].get("annotations", {})
        if ann.get("prometheus.io/port") != str(ports.get("metrics")):
            e(f"Deployment {name}: prometheus.io/port is not the metrics port")
        repo = flag_values.get("model-repository", "")
        mounts = [m["mountPath"] for m in c.get("volumeMounts", [])]
        if repo.startswith("/opt/shoal/models"):
            pass  # baked into the image (deploy/Dockerfile)
        elif not any(repo == m or repo.startswith(m.rstrip("/") + "/") for m in mounts):
            e(f"Deployment {name}: model repository {repo} is not mounted")
        volumes = {v["name"] for v in pod.get("volumes", [])}
        for m in c.get("volumeMounts", []):
            if m["name"] not in volumes:
                e(f"Deployment {name}: volumeMount {m['name']} has no volume")
        res = c.get("resources", {})
        for r, lim in res.get("limits", {}).items():
            req = res.get("requests", {}).get(r)
            if req is not None and quantity(req) > quantity(lim):
                e(f"Deployment {name}: {r} request {req} above its limit {lim}")
        if "cpu" not in res.get("requests", {}) or "memory" not in res.get("limits", {}):
            e(f"Deployment {name}: cpu request and memory limit are required")
        stop = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
        pre_stop = int(stop[1]) if stop[:1] == ["sleep"] and len(stop) == 2 else 0
        grace = pod.get("terminationGracePeriodSeconds", 30)
        # The drain answers what is queued: bounded by queue timeouts and deadlines; give it
        # at least 30 s beyond preStop.
        if grace < pre_stop + 30:
            e(f"Deployment {name}: terminationGracePeriodSeconds {grace} leaves under 30 s "
              f"for the drain after a {pre_stop} s preStop")
        sc = pod.get("securityContext", {})
        if not sc.get("runAsNonRoot") or sc.get("runAsUser", 0) == 0:
            e(f"Deployment {name}: must run as a non-root user")
    all_ports = {p.get("name") for d in deployments.values()
                 for c in d["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}
    pod_labels = [d["spec"]["template"]["metadata"]["labels"] for d in deployments.values()]
    for s in by_kind.get("Service", []):
        if not any(selects(s["spec"]["selector"], l) for l in pod_labels):
            e(f"Service {s['metadata']['name']}: selects no Deployment's pods")
        for p in s["spec"]["ports"]:
            if isinstance(p.get("targetPort"), str) and p["targetPort"] not in all_ports:
                e(f"Service {s['metadata']['name']}: targetPort {p['targetPort']} is no "
                  "container port")
    for p in by_kind.get("PodDisruptionBudget", []):
        if not any(selects(p["spec"]["selector"].get("matchLabels"), l) for l in pod_labels):
            e(f"PodDisruptionBudget {p['metadata']['name']}: selects no pods")
        if ("minAvailable" in p["spec"]) == ("maxUnavailable" in p["spec"]):
            e(f"PodDisruptionBudget {p['metadata']['name']}: set one of minAvailable, "
              "maxUnavailable")
    for h in by_kind.get("HorizontalPodAutoscaler", []):
        ref, spec = h["spec"]["scaleTargetRef"], h["spec"]
        if ref["kind"] != "Deployment" or ref["name"] not in deployments:
            e(f"HorizontalPodAutoscaler {h['metadata']['name']}: targets no Deployment here")
        if spec.get("minReplicas", 1) > spec["maxReplicas"] or spec.get("minReplicas", 1) < 1:
            e(f"HorizontalPodAutoscaler {h['metadata']['name']}: bad replica bounds")
        for m in spec.get("metrics", []):
            key = m["type"][0].lower() + m["type"][1:]
            if key not in m:
                e(f"HorizontalPodAutoscaler: metric of type {m['type']} has no {key}")
        d = deployments.get(ref["name"])
        if d and not spec.get("minReplicas", 1) <= d["spec"].get("replicas", 1) <= spec["maxReplicas"]:
            e(f"Deployment {ref['name']}: replicas outside the HPA's bounds")


def serve_options(shoal):
    out = subprocess.run([shoal, "serve", "--help"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, check=True).stdout.decode()
    return set(re.findall(r"--([a-z0-9][a-z0-9-]*)", out))


def check_dir(kubectl, d, serve_flags):
    where = os.path.relpath(d, os.path.dirname(KUBE))
    p = subprocess.run([kubectl, "kustomize", d], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE)
    if p.returncode != 0:
        return [f"{where}: kubectl kustomize failed: {p.stderr.decode()}"]
    objs = [o for o in yaml.safe_load_all(p.stdout) if o]
    errors = []
    for o in objs:
        if not isinstance(o, dict):
            errors.append(f"{where}: a document is not a mapping")
            continue
        key = (o.get("apiVersion"), o.get("kind"))
        name = f"{where}: {key[1]} {o.get('metadata', {}).get('name')}"
        if key not in SCHEMAS:
            errors.append(f"{name}: no schema for {key} (add one to {os.path.basename(__file__)})")
            continue
        check_schema(o, SCHEMAS[key], name, errors)
    if not errors:
        check_consistency(objs, where, serve_flags, errors)
    print(f"{where}: {len(objs)} objects: " +
          ", ".join(f"{o['kind']}/{o['metadata']['name']}" for o in objs if isinstance(o, dict)))
    return errors


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kubectl", default="kubectl")
    p.add_argument("--shoal", help="shoal binary whose `serve --help` the args must match")
    p.add_argument("dirs", nargs="*")
    a = p.parse_args()
    dirs = a.dirs or [os.path.join(KUBE, "base")] + sorted(
        os.path.join(KUBE, "overlays", o) for o in os.listdir(os.path.join(KUBE, "overlays")))
    serve_flags = serve_options(a.shoal) if a.shoal else None
    errors = []
    for d in dirs:
        errors += check_dir(a.kubectl, d, serve_flags)
    for err in errors:
        print("ERROR:", err)
    print("FAILED" if errors else "OK")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
