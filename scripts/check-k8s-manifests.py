#!/usr/bin/env python3
"""Validates the Kubernetes manifests in deploy/kubernetes/ (run by scripts/check-deploy-files.sh
with the Python of the deploy tools' virtual environment, which has kubernetes-validate,
jsonschema and PyYAML).

Every document goes to exactly one validator, chosen by its apiVersion and kind:
- InferencePool (inference.networking.k8s.io/v1): the v1 schema of the upstream CRD vendored in
  tests/fixtures/crds/, made strict (an object schema that lists its properties and does not
  allow others says additionalProperties: false, so a misspelt field fails as the API server's
  strict field validation would), with the CRD's CEL rules evaluated (see RULES);
- ServiceMonitor (monitoring.coreos.com/v1): scripts/check-servicemonitor.mjs (node);
- anything else: kubernetes-validate, strict, against Kubernetes 1.33. A kind it has no schema
  for fails here (its CLI only warns and exits 0), so no document goes unchecked.
Then the files are checked against each other: the names, labels and ports that tie the
Service, ServiceMonitor, HPA, prometheus-adapter rule and InferencePool to the Deployment.

Usage: check-k8s-manifests.py [--self-test] [FOLDER]   (FOLDER: deploy/kubernetes by default)

--self-test breaks copies of the manifests one fault at a time and expects each fault to be
reported, so that no validator can quietly turn into one that passes everything.
"""

import copy
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = ROOT / "deploy" / "kubernetes"
CRD = ROOT / "tests" / "fixtures" / "crds" / "inference.networking.k8s.io_inferencepools.yaml"
SERVICEMONITOR_CHECK = ROOT / "scripts" / "check-servicemonitor.mjs"
KUBERNETES_VERSION = "1.33.0"
# What the issue asks the manifests to hold; a file dropped by mistake fails here.
REQUIRED_KINDS = {"Deployment", "Service", "HorizontalPodAutoscaler", "ConfigMap", "ServiceMonitor", "InferencePool"}

# The CRD's x-kubernetes-validations (CEL), by their exact text. A rule not listed fails the
# check, so a newer CRD with new rules gets them taught here rather than skipped.
RULES = {
    # endpointPickerRef: kind defaults to Service.
    "self.kind != 'Service' || has(self.port)": lambda ref: ref.get("kind", "Service") != "Service" or "port" in ref,
    # targetPorts
    "self.all(p1, self.exists_one(p2, p1.number==p2.number))": lambda ports: len({p.get("number") for p in ports})
    == len(ports),
}

# The CRD leaves metadata open (`type: object`); the API server checks it as ObjectMeta. The
# fields a manifest sets, strictly.
METADATA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"},
        "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "required": ["name"],
    "additionalProperties": False,
}


def load_crd() -> dict:
    """The CRD, after checking it is upstream's file unchanged (the blob id its header names)."""
    lines = CRD.read_text().splitlines(keepends=True)
    header = 0
    while header < len(lines) and lines[header].startswith("#"):
        header += 1
    body = "".join(lines[header:]).encode()
    blob = re.search(r"^# git blob: ([0-9a-f]{40})$", "".join(lines[:header]), re.M)
    actual = hashlib.sha1(b"blob %d\0" % len(body) + body).hexdigest()
    if not blob or blob.group(1) != actual:
        sys.exit(f"{CRD}: the vendored file is not the upstream blob its header names (it hashes to {actual})")
    return yaml.safe_load(body)


def strict(schema: dict) -> dict:
    """`schema` with additionalProperties: false wherever an object lists its properties and says
    nothing else about extra ones."""
    schema = dict(schema)
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        schema["additionalProperties"] = False
    if "properties" in schema:
        schema["properties"] = {k: strict(v) for k, v in schema["properties"].items()}
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            schema[key] = strict(schema[key])
    return schema


def rule_problems(schema: dict, value, path: str) -> list[str]:
    """Evaluates the CEL rules of `schema` and of the schemas below it that `value` reaches."""
    found = []
    for rule in schema.get("x-kubernetes-validations", []):
        check = RULES.get(rule["rule"])
        if check is None:
            found.append(f"{path}: the CRD's rule `{rule['rule']}` is unknown to scripts/check-k8s-manifests.py")
        elif not check(value):
            found.append(f"{path}: {rule.get('message', rule['rule'])}")
    if isinstance(value, dict):
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                found += rule_problems(sub, value[key], f"{path}.{key}" if path else key)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            found += rule_problems(schema["items"], item, f"{path}[{i}]")
    return found


def crd_validator(crd: dict):
    """A function that returns the problems of one document of the CRD's kind."""
    group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
    versions = {f"{group}/{v['name']}": v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"] if v["served"]}

    def problems(doc: dict) -> list[str]:
        schema = versions.get(doc.get("apiVersion"))
        if schema is None or doc.get("kind") != kind:
            return [f"{doc.get('apiVersion')} {doc.get('kind')} is not served by the {kind} CRD"]
        full = strict({**schema, "properties": {**schema["properties"], "metadata": METADATA}})
        validator = jsonschema.Draft202012Validator(full)
        found = [f"{'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in validator.iter_errors(doc)]
        return found + rule_problems(schema, doc, "")

    return problems


def core_problems(doc: dict) -> list[str]:
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        return [
            f"no validator knows {doc.get('apiVersion')} {doc.get('kind')}: add one to scripts/check-k8s-manifests.py"
        ]
    except kubernetes_validate.ValidationError as e:
        return [f"{'.'.join(map(str, e.path)) or '(root)'}: {e.message}"]
    return []


def servicemonitor_problems(docs: list[dict]) -> list[str]:
    if not docs:
        return []
    done = subprocess.run(
        ["node", str(SERVICEMONITOR_CHECK)], input=json.dumps(docs), capture_output=True, text=True, check=False
    )
    lines = done.stderr.strip().splitlines()
    if done.returncode != 0 and not lines:
        lines = [f"{SERVICEMONITOR_CHECK.name} exited {done.returncode}"]
    return lines


def flag(args: list[str], name: str) -> str | None:
    """The value of `--name=value` or `--name value` in `args`."""
    for i, arg in enumerate(args):
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
        if arg == name and i + 1 < len(args):
            return args[i + 1]
    return None


def cross_problems(docs: list[dict]) -> list[str]:
    """What ties the files together: selectors match the pods, ports exist, metric names agree."""
    by_kind: dict[str, list[dict]] = {}
    for doc in docs:
        by_kind.setdefault(doc.get("kind"), []).append(doc)
    found = [f"no {kind} among the manifests" for kind in sorted(REQUIRED_KINDS - by_kind.keys())]
    if found:
        return found

    def selects(selector: dict, labels: dict) -> bool:
        return bool(selector) and all(labels.get(k) == v for k, v in selector.items())

    deployments = by_kind["Deployment"]
    services = by_kind["Service"]
    for d in deployments:
        name, pod = d["metadata"]["name"], d["spec"]["template"]
        labels = pod.get("metadata", {}).get("labels", {})
        container = pod["spec"]["containers"][0]
        ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
        if flag(container.get("args", []), "--metrics-prefix") != "vllm":
            found.append(f"Deployment {name}: no --metrics-prefix=vllm (the HPA and the endpoint picker read vllm:...)")
        for s in services:
            if not selects(s["spec"].get("selector", {}), labels):
                found.append(f"Service {s['metadata']['name']} does not select Deployment {name}'s pods")
            for p in s["spec"]["ports"]:
                target = p.get("targetPort", p["port"])  # the port itself when unset
                if target not in ports and target not in ports.values():
                    found.append(f"Service {s['metadata']['name']}: targetPort {target} is not a port of {name}")
        for pool in by_kind["InferencePool"]:
            if not selects(pool["spec"]["selector"]["matchLabels"], labels):
                found.append(f"InferencePool {pool['metadata']['name']} does not select Deployment {name}'s pods")
            for p in pool["spec"]["targetPorts"]:
                if p["number"] not in ports.values():
                    found.append(
                        f"InferencePool {pool['metadata']['name']}: port {p['number']} is not a port of {name}"
                    )
    for monitor in by_kind["ServiceMonitor"]:
        watched = [
            s for s in services if selects(monitor["spec"]["selector"].get("matchLabels", {}), s["metadata"]["labels"])
        ]
        if not watched:
            found.append(f"ServiceMonitor {monitor['metadata']['name']} selects no Service")
        for endpoint in monitor["spec"]["endpoints"]:
            if any(endpoint.get("port") not in {p.get("name") for p in s["spec"]["ports"]} for s in watched):
                found.append(
                    f"ServiceMonitor {monitor['metadata']['name']}: no Service port named {endpoint.get('port')}"
                )
    # prometheus-adapter's renames (Go's regexp replacement: ${1} is the first group).
    served = set()
    for config_map in by_kind["ConfigMap"]:
        adapter = yaml.safe_load(config_map.get("data", {}).get("config.yaml", "")) or {}
        for rule in adapter.get("rules", []):
            series = rule["seriesQuery"].split("{")[0]
            replacement = re.sub(r"\$\{?(\d+)\}?", r"\\g<\1>", rule["name"]["as"])
            served.add(re.sub(rule["name"]["matches"], replacement, series))
    for hpa in by_kind["HorizontalPodAutoscaler"]:
        target = hpa["spec"]["scaleTargetRef"]["name"]
        if target not in {d["metadata"]["name"] for d in deployments}:
            found.append(f"HPA {hpa['metadata']['name']} scales {target}, which no Deployment here is")
        for metric in hpa["spec"].get("metrics", []):
            if metric["type"] == "Pods" and metric["pods"]["metric"]["name"] not in served:
                wanted = metric["pods"]["metric"]["name"]
                found.append(f"HPA {hpa['metadata']['name']}: no prometheus-adapter rule serves {wanted} ({served})")
    return found


def problems(files: dict[str, list[dict]], crd_problems) -> list[str]:
    """Every problem of the manifests `files` (file name -> its documents)."""
    found, monitors = [], []
    for name, docs in files.items():
        for doc in docs:
            what = f"{name}: {doc.get('kind')} {doc.get('metadata', {}).get('name')}"
            if doc.get("kind") == "ServiceMonitor" and doc.get("apiVersion") == "monitoring.coreos.com/v1":
                monitors.append(doc)
                continue
            if doc.get("kind") == "InferencePool":
                found += [f"{what}: {p}" for p in crd_problems(doc)]
            else:
                found += [f"{what}: {p}" for p in core_problems(doc)]
    found += servicemonitor_problems(monitors)
    # The cross-checks read fields the schemas require: only once every document is valid.
    return found or cross_problems([doc for docs in files.values() for doc in docs])


def load(folder: Path) -> dict[str, list[dict]]:
    files = {}
    for path in sorted(folder.glob("*.yaml")):
        name = path.resolve().relative_to(ROOT) if path.resolve().is_relative_to(ROOT) else path
        files[str(name)] = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    if not files:
        sys.exit(f"{folder}: no *.yaml files")
    return files


def self_test(files: dict[str, list[dict]], crd_problems) -> None:
    """Each fault, made in a copy of the manifests, must be reported with the expected words."""

    def first(kind):
        return lambda fs: next(d for docs in fs.values() for d in docs if d.get("kind") == kind)

    deployment, monitor, pool, hpa = (
        first(k) for k in ("Deployment", "ServiceMonitor", "InferencePool", "HorizontalPodAutoscaler")
    )

    def container(fs):
        return deployment(fs)["spec"]["template"]["spec"]["containers"][0]

    faults = [
        (
            "misspelt Deployment field",
            lambda fs: container(fs)["readinessProbe"]["httpGet"].update(paht="/ready"),
            "paht",
        ),
        ("wrong type in a Deployment", lambda fs: deployment(fs)["spec"].update(replicas="two"), "replicas"),
        ("a kind no validator knows", lambda fs: deployment(fs).update(kind="Deploymnet"), "no validator knows"),
        ("misspelt ServiceMonitor field", lambda fs: monitor(fs)["spec"]["endpoints"][0].update(prot="http"), "prot"),
        (
            "bad ServiceMonitor interval",
            lambda fs: monitor(fs)["spec"]["endpoints"][0].update(interval="10 s"),
            "interval",
        ),
        (
            "misspelt InferencePool field",
            lambda fs: pool(fs)["spec"].update(targetPort=[{"number": 8000}]),
            "targetPort",
        ),
        (
            "bad InferencePool failureMode",
            lambda fs: pool(fs)["spec"]["endpointPickerRef"].update(failureMode="Open"),
            "failureMode",
        ),
        (
            "InferencePool picker without a port",
            lambda fs: pool(fs)["spec"]["endpointPickerRef"].pop("port"),
            "port is required",
        ),
        ("duplicate InferencePool port", lambda fs: pool(fs)["spec"]["targetPorts"].append({"number": 8000}), "unique"),
        (
            "HPA metric no rule serves",
            lambda fs: hpa(fs)["spec"]["metrics"][0]["pods"]["metric"].update(name="vllm_waiting"),
            "prometheus-adapter",
        ),
        ("Deployment without vLLM metric names", lambda fs: container(fs).update(args=["serve"]), "--metrics-prefix"),
    ]
    for name, breaks, expected in faults:
        broken = copy.deepcopy(files)
        breaks(broken)
        found = problems(broken, crd_problems)
        hit = next((p for p in found if expected in p), None)
        if hit is None:
            sys.exit(f"self-test: {name} was not reported (expected {expected!r}); reported: {found}")
        print(f"self-test: {name}: reported: {hit[:160]}", file=sys.stderr)
    print(f"self-test: each of {len(faults)} faults made in a copy of the manifests was reported", file=sys.stderr)


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--self-test"]
    folder = Path(args[0]) if args else MANIFESTS
    files = load(folder)
    crd_problems = crd_validator(load_crd())
    found = problems(files, crd_problems)
    if found:
        sys.exit(f"{folder}:\n  " + "\n  ".join(found))
    for name, docs in files.items():
        kinds = ", ".join(f"{d['kind']} {d['metadata']['name']}" for d in docs)
        print(f"{name}: {kinds}: valid", file=sys.stderr)
    if "--self-test" in sys.argv[1:]:
        self_test(files, crd_problems)


if __name__ == "__main__":
    main()
