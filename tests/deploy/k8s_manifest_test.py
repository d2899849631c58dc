#!/usr/bin/env python3
"""The Kubernetes manifest deploy/kubernetes/gpucd-daemonset.yaml, checked without a cluster.

1. Schema: the DaemonSet goes through the Kubernetes API's own models (Debian's
   python3-kubernetes, generated from the API's OpenAPI schema) and back; a field the schema does
   not have, or of the wrong type, does not come back the same, and a required field missing
   fails the models' validation.
2. What gpucd relies on: one GPU from the NVIDIA device plugin (nvidia.com/gpu), the daemon's
   flags as the daemon itself parses them (`gpucd ARGS --version`), the socket folder of the
   ipc:// listener on a hostPath, the TLS files in the secret's mount, the readiness probe on
   /health/ready and the liveness probe on /health/live of --stats-listen's port, reachable
   from the kubelet (not loopback), a grace period longer than the drain.

    k8s_manifest_test.py MANIFEST GPUCD_DAEMON
Exits 77 (skipped, after the checks of part 2) where python3-kubernetes is missing.
"""
import json
import subprocess
import sys
from urllib.parse import urlparse

import yaml

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
    return ok


def flags(args):
    """--name=value arguments as a list of (name, value)."""
    out = []
    for a in args:
        name, _, value = a.partition("=")
        out.append((name, value))
    return out


def schema_check(doc):
    """1 when the document survives the API models' round trip, 0 when it does not, None when
    the models are not installed."""
    try:
        from kubernetes.client import ApiClient, V1DaemonSet  # noqa: F401
    except ImportError:
        return None

    class Response:  # what ApiClient.deserialize reads
        def __init__(self, data):
            self.data = json.dumps(data)

    # Quantities (resources) are ints or strings in the schema, strings through the models.
    doc = json.loads(json.dumps(doc))
    for c in doc["spec"]["template"]["spec"].get("containers", []):
        for kind in ("limits", "requests"):
            q = c.get("resources", {}).get(kind, {})
            q.update({k: str(v) for k, v in q.items()})
    api = ApiClient()
    try:
        obj = api.deserialize(Response(doc), "V1DaemonSet")
    except (ValueError, TypeError) as e:
        check(False, f"the API's models refuse the DaemonSet: {e}")
        return 0
    back = api.sanitize_for_serialization(obj)
    return 1 if check(back == doc, "fields the DaemonSet schema lacks, or of another type: "
                      + diff(doc, back)) else 0


def diff(a, b, path=""):
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                return diff(a.get(k), b.get(k), f"{path}.{k}")
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return diff(x, y, f"{path}[{i}]")
    return f"{path}: {a!r} in the file, {b!r} through the schema"


def main():
    manifest, daemon = sys.argv[1], sys.argv[2]
    with open(manifest) as f:
        docs = [d for d in yaml.safe_load_all(f) if d is not None]
    check(len(docs) == 1, f"{len(docs)} documents; expected the DaemonSet alone")
    ds = docs[0]
    check((ds.get("apiVersion"), ds.get("kind")) == ("apps/v1", "DaemonSet"),
          "not an apps/v1 DaemonSet")
    spec = ds["spec"]
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"]["labels"]
    check(all(labels.get(k) == v for k, v in spec["selector"]["matchLabels"].items()),
          "the selector does not match the pod template's labels")
    [c] = [c for c in pod["containers"] if c.get("name") == "gpucd"]
    check(c["resources"]["limits"].get("nvidia.com/gpu") == 1,
          "the container does not ask the device plugin for one nvidia.com/gpu")

    args = flags(c.get("args", []))
    run = subprocess.run([daemon, *c["args"], "--version"], capture_output=True, text=True,
                         timeout=30)
    check(run.returncode == 0, f"the daemon refuses the manifest's arguments: {run.stderr}")
    opt = {}
    for name, value in args:
        opt.setdefault(name, []).append(value)
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}

    ipc = [urlparse(u).path for u in opt.get("--listen", []) if u.startswith("ipc://")]
    if check(len(ipc) == 1, "no single ipc:// listener"):
        folder = ipc[0].rsplit("/", 1)[0]
        socket_vols = [n for n, p in mounts.items() if p == folder]
        check(len(socket_vols) == 1 and "hostPath" in volumes[socket_vols[0]],
              f"the socket folder {folder} is not a hostPath volume of the node")
    tls = [u for u in opt.get("--listen", []) if u.startswith("tls+tcp://")]
    if check(len(tls) == 1, "no tls+tcp:// listener for remote clients"):
        port = urlparse(tls[0]).port
        check(any(p["containerPort"] == port and p.get("hostPort") == port for p in c["ports"]),
              f"the TLS port {port} is not the node's (hostPort)")
        secret_mounts = {mounts[n] for n, v in volumes.items() if "secret" in v and n in mounts}
        for f in ("--tls-cert", "--tls-key", "--tls-ca"):
            path = opt.get(f, [""])[0]
            check(path.rsplit("/", 1)[0] in secret_mounts, f"{f} {path} is not in a secret's mount")

    stats = urlparse(opt.get("--stats-listen", ["http://127.0.0.1:9464"])[0])
    check(stats.hostname not in ("127.0.0.1", "localhost", "::1"),
          "--stats-listen on loopback: the kubelet's probes cannot reach it")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    for probe, path in (("readinessProbe", "/health/ready"), ("livenessProbe", "/health/live")):
        g = c.get(probe, {}).get("httpGet", {})
        check(g.get("path") == path and ports.get(g.get("port"), g.get("port")) == stats.port,
              f"{probe} is not an HTTP GET of {path} on --stats-listen's port {stats.port}")
    drain = int(opt.get("--drain-timeout-s", ["10"])[0])
    check(pod.get("terminationGracePeriodSeconds", 30) > drain,
          "the grace period does not outlast --drain-timeout-s")

    schema = schema_check(ds)
    for f in failures:
        print(f"k8s_manifest_test: {f}", file=sys.stderr)
    if failures:
        return 1
    if schema is None:
        print("python3-kubernetes not installed: the schema check is skipped")
        return 77
    print(f"checked: {manifest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
