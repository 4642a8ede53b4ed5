#!/usr/bin/env python3
"""Validates the Kubernetes manifests in deploy/ (run by deploy/validate.sh; exit 1 if any is bad).

- Core kinds (Service, ConfigMap, PersistentVolumeClaim, Job, ...) against the Kubernetes JSON
  schemas that the kubernetes-validate package bundles, in strict mode (an unknown field is an
  error), for each Kubernetes version in KUBERNETES_VERSIONS.
- A Kubeflow Trainer v2 ClusterTrainingRuntime and TrainJob against their CRD schemas (schemas/,
  v2.3.0), strictly; each replicated Job against Kubernetes' Job schema and cohort's pod needs;
  and a TrainJob's COHORT_NUM_NODES against its numNodes, with the runtime's TF_CONFIG script
  run for every node.
- A PodMonitor against the Prometheus Operator's CRD schema (schemas/, v0.93.0), selecting
  cohort's pods and their `metrics` port.
- A TFJob against the TFJob CRD's openAPIV3Schema (schemas/, from the Kubeflow training
  operator), plus what the operator's admission webhook checks (replica types, at most one Chief
  or Master, a container named `tensorflow` with an image in every replica), plus each replica's
  pod template strictly against Kubernetes' own PodTemplate schema (the CRD's copy of the pod
  schema would let a misspelt field through: the API server prunes unknown fields silently).
- cohort's own requirements of a pod that runs it: a UDP port (QUIC); metrics on, with liveness
  and readiness probes of /healthz on the metrics port; CPU and memory requests equal to their
  limits; and a termination grace period above its preemption_grace, so that a preempted chief's checkpoint is written before the
  kubelet's SIGKILL; and, for Indexed Jobs, that the cluster spec in the ConfigMap names exactly
  the stable host names of the Jobs' pods.
"""

import json
import re
import sys
import tomllib
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml

KUBERNETES_VERSIONS = ["1.31.0", "1.37.0"]
TFJOB_SCHEMA = Path(__file__).parent / "schemas" / "tfjob-v1.9.0.schema.json"
PODMONITOR_SCHEMA = Path(__file__).parent / "schemas" / "podmonitor-v0.93.0.schema.json"
TRAINER_SCHEMAS = {
    "TrainJob": Path(__file__).parent / "schemas" / "trainjob-v2.3.0.schema.json",
    "ClusterTrainingRuntime":
        Path(__file__).parent / "schemas" / "clustertrainingruntime-v2.3.0.schema.json",
}
# The labels and the metrics port every cohort pod of the manifests carries, which a
# PodMonitor must select.
COHORT_POD_LABELS = {"app.kubernetes.io/name": "cohort", "app.kubernetes.io/instance": "cohort-demo"}
COHORT_METRICS_PORT = "metrics"
TFJOB_REPLICA_TYPES = {"Chief", "Master", "PS", "Worker", "Evaluator"}
TFJOB_RESTART_POLICIES = {"Always", "OnFailure", "Never", "ExitCode"}
# cohort's default preemption_grace (src/cluster/config.rs) and Kubernetes' default
# terminationGracePeriodSeconds.
DEFAULT_PREEMPTION_GRACE_S = 10.0
DEFAULT_TERMINATION_GRACE_S = 30


def main(paths):
    errors = []
    count = len(paths)
    for path in [p for p in paths if p.endswith(".json")]:
        found = check_dashboard(path)
        errors += [f"{path}: {error}" for error in found]
        if not found:
            print(f"ok   {path}: Grafana dashboard")
    paths = [p for p in paths if not p.endswith(".json")]
    for path in paths:
        try:
            docs = [d for d in yaml.safe_load_all(Path(path).read_text()) if d is not None]
        except (OSError, yaml.YAMLError) as e:
            errors.append(f"{path}: {e}")
            continue
        if not docs:
            errors.append(f"{path}: no manifest in the file")
        if not all(isinstance(d, dict) for d in docs):
            errors.append(f"{path}: a document is not a mapping")
            continue
        configs = cohort_configs(docs)
        bad = False
        for doc in docs:
            where = f"{path}: {doc.get('kind', '?')}/{doc.get('metadata', {}).get('name', '?')}"
            found = check(doc, configs)
            errors += [f"{where}: {error}" for error in found]
            bad = bad or bool(found)
            if not found:
                print(f"ok   {where}")
        # Cross-object checks read fields the schemas require: only on valid objects.
        if not bad:
            errors += [f"{path}: {error}" for error in check_indexed_jobs(docs, configs)]
            errors += [f"{path}: {error}" for error in check_trainjobs(docs)]
    for error in errors:
        print(f"FAIL {error}")
    print(f"{count} file(s), {len(errors)} error(s)")
    return 1 if errors else 0


def check(doc, configs):
    if not isinstance(doc, dict) or "apiVersion" not in doc or "kind" not in doc:
        return ["not a Kubernetes object (no apiVersion or kind)"]
    if doc["apiVersion"] == "kubeflow.org/v1" and doc["kind"] == "TFJob":
        return check_tfjob(doc, configs)
    if doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["kind"] == "PodMonitor":
        return check_podmonitor(doc)
    if doc["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and doc["kind"] in TRAINER_SCHEMAS:
        return check_trainer(doc, configs)
    errors = kubernetes_errors(doc)
    template = doc.get("spec", {}).get("template") if doc["kind"] == "Job" else None
    if template is not None and not errors:
        errors += cohort_pod_errors("spec.template", template, configs)
    return errors


def kubernetes_errors(doc):
    """The object against each Kubernetes version's strict schema."""
    errors = []
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            errors.append(f"Kubernetes {e.version} schema: {path}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError as e:
            errors.append(f"no Kubernetes schema: {e.message}")
    return errors


def check_tfjob(doc, configs):
    schema = json.loads(TFJOB_SCHEMA.read_text())
    validator = jsonschema.Draft7Validator(schema)
    errors = [
        f"TFJob CRD schema: {'.'.join(str(p) for p in e.path)}: {e.message}"
        for e in sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
    ]
    if errors:
        return errors
    if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", doc["metadata"].get("name", "")):
        errors.append("metadata.name: must be a DNS-1035 label (the operator refuses it)")
    specs = doc.get("spec", {}).get("tfReplicaSpecs")
    if not specs:
        return errors + ["spec.tfReplicaSpecs: required"]
    chiefs = [t for t in specs if t in ("Chief", "Master")]
    if len(chiefs) > 1:
        errors.append(f"spec.tfReplicaSpecs: more than one Chief or Master: {chiefs}")
    for rtype, spec in specs.items():
        where = f"spec.tfReplicaSpecs.{rtype}"
        if rtype not in TFJOB_REPLICA_TYPES:
            errors.append(f"{where}: unknown replica type (expected one of "
                          f"{', '.join(sorted(TFJOB_REPLICA_TYPES))})")
        policy = spec.get("restartPolicy", "Never")
        if policy not in TFJOB_RESTART_POLICIES:
            errors.append(f"{where}.restartPolicy: {policy!r} is not one of "
                          f"{', '.join(sorted(TFJOB_RESTART_POLICIES))}")
        template = spec.get("template", {})
        containers = template.get("spec", {}).get("containers", [])
        if not any(c.get("name") == "tensorflow" for c in containers):
            errors.append(f"{where}.template.spec.containers: no container named tensorflow "
                          "(the operator writes TF_CONFIG into that one)")
        for i, c in enumerate(containers):
            if not c.get("image"):
                errors.append(f"{where}.template.spec.containers[{i}].image: required")
        pod_template = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": f"{doc['metadata']['name']}-{rtype.lower()}"},
            "template": template,
        }
        errors += [f"{where}.template: {e}" for e in kubernetes_errors(pod_template)]
        errors += cohort_pod_errors(f"{where}.template", template, configs)
    return errors


def check_podmonitor(doc):
    """Against the Prometheus Operator's PodMonitor CRD schema; it must select cohort's pods
    and scrape their metrics port."""
    schema = json.loads(PODMONITOR_SCHEMA.read_text())
    validator = jsonschema.Draft7Validator(schema)
    errors = [
        f"PodMonitor CRD schema: {'.'.join(str(p) for p in e.path)}: {e.message}"
        for e in sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
    ]
    errors += unknown_fields(doc, schema, "")
    if errors:
        return errors
    spec = doc.get("spec", {})
    selector = spec.get("selector", {}).get("matchLabels", {})
    if not selector or any(COHORT_POD_LABELS.get(k) != v for k, v in selector.items()):
        errors.append(f"spec.selector.matchLabels: {selector} does not select cohort's pods "
                      f"(labelled {COHORT_POD_LABELS})")
    endpoints = spec.get("podMetricsEndpoints", [])
    if not any(e.get("port") == COHORT_METRICS_PORT for e in endpoints):
        errors.append(f"spec.podMetricsEndpoints: none scrapes the port "
                      f"{COHORT_METRICS_PORT!r}")
    return errors


def unknown_fields(node, schema, path):
    """Fields a CRD schema does not name (the API server would prune them silently: a
    misspelt field would do nothing)."""
    errors = []
    if isinstance(node, dict) and "properties" in schema \
            and not schema.get("x-kubernetes-preserve-unknown-fields") \
            and "additionalProperties" not in schema:
        for key, value in node.items():
            where = f"{path}.{key}" if path else key
            if key not in schema["properties"]:
                errors.append(f"{where}: unknown field")
            else:
                errors += unknown_fields(value, schema["properties"][key], where)
    elif isinstance(node, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(node):
            errors += unknown_fields(item, schema["items"], f"{path}[{i}]")
    return errors


def exported_metrics():
    """The metric names cohort's processes export: every `"cohort_..."` and `"process_..."`
    string in its sources (the names it registers)."""
    src = Path(__file__).parent.parent / "src"
    names = set()
    for path in src.rglob("*.rs"):
        names.update(re.findall(r'"((?:cohort|process)_[a-z_]+)"', path.read_text()))
    return names


def check_dashboard(path):
    """A Grafana dashboard: its structure, and every metric its queries name is one cohort
    exports (a counter's `_total`, a histogram's `_bucket`/`_count`/`_sum` included)."""
    try:
        dashboard = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        return [str(e)]
    errors = [f"{key}: required" for key in ("title", "uid", "panels", "schemaVersion")
              if key not in dashboard]
    exported = exported_metrics()
    ids = set()
    for i, panel in enumerate(dashboard.get("panels", [])):
        where = f"panels[{i}] ({panel.get('title', '?')})"
        for key in ("id", "type", "title", "gridPos", "targets"):
            if key not in panel:
                errors.append(f"{where}.{key}: required")
        if panel.get("id") in ids:
            errors.append(f"{where}.id: {panel.get('id')} is used twice")
        ids.add(panel.get("id"))
        targets = panel.get("targets", [])
        if not targets:
            errors.append(f"{where}.targets: no query")
        refs = [t.get("refId") for t in targets]
        if len(set(refs)) != len(refs) or None in refs:
            errors.append(f"{where}.targets: refIds {refs} are not distinct")
        for t in targets:
            expr = t.get("expr", "")
            if expr.count("(") != expr.count(")") or expr.count("[") != expr.count("]"):
                errors.append(f"{where}: unbalanced brackets in {expr!r}")
            for name in re.findall(r"\b(?:cohort|process)_[a-z_]+", expr):
                base = re.sub(r"_(total|bucket|count|sum)$", "", name)
                if name not in exported and base not in exported:
                    errors.append(f"{where}: {name} is not a metric cohort exports")
    return errors


def crd_errors(doc, schema_path, kind):
    """Against a CRD's openAPIV3Schema, with no field the schema does not name."""
    schema = json.loads(schema_path.read_text())
    validator = jsonschema.Draft7Validator(schema)
    errors = [
        f"{kind} CRD schema: {'.'.join(str(p) for p in e.path)}: {e.message}"
        for e in sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
    ]
    return errors + [f"{kind} CRD schema: {e}" for e in unknown_fields(doc, schema, "")]


def check_trainer(doc, configs):
    """A Kubeflow Trainer v2 TrainJob or ClusterTrainingRuntime: its CRD schema; for a
    runtime, each replicated Job strictly against Kubernetes' Job schema and its pods against
    cohort's needs."""
    errors = crd_errors(doc, TRAINER_SCHEMAS[doc["kind"]], doc["kind"])
    if errors or doc["kind"] != "ClusterTrainingRuntime":
        return errors
    jobs = doc["spec"].get("template", {}).get("spec", {}).get("replicatedJobs", [])
    if not any(j.get("name") == "node" for j in jobs):
        errors.append("spec.template.spec.replicatedJobs: no Job named node (Trainer sets "
                      "the TrainJob's numNodes and env on it)")
    for i, job in enumerate(jobs):
        where = f"spec.template.spec.replicatedJobs[{i}]"
        as_job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": f"{doc['metadata']['name']}-{job.get('name', i)}"},
            "spec": job.get("template", {}).get("spec", {}),
        }
        errors += [f"{where}.template: {e}" for e in kubernetes_errors(as_job)]
        template = as_job["spec"].get("template", {})
        errors += cohort_pod_errors(f"{where}.template.spec.template", template, configs)
    return errors


def check_trainjobs(docs):
    """A TrainJob of a cohort runtime in the same file: COHORT_NUM_NODES is its numNodes, and
    the runtime's script, run for every node (cohort replaced by printing what it would get),
    gives each the TF_CONFIG of a chief and numNodes - 1 workers at the JobSet's pod names."""
    runtimes = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "ClusterTrainingRuntime"}
    errors = []
    for doc in docs:
        if doc.get("kind") != "TrainJob":
            continue
        name = doc["metadata"]["name"]
        runtime = runtimes.get(doc["spec"]["runtimeRef"]["name"])
        if runtime is None:
            continue
        trainer = doc["spec"].get("trainer", {})
        nodes = trainer.get("numNodes", runtime["spec"].get("mlPolicy", {}).get("numNodes", 1))
        env = {e["name"]: e.get("value") for e in trainer.get("env", [])}
        where = f"TrainJob/{name}"
        if env.get("COHORT_NUM_NODES") != str(nodes):
            errors.append(f"{where}: spec.trainer.env COHORT_NUM_NODES is "
                          f"{env.get('COHORT_NUM_NODES')!r}, not numNodes {nodes}")
            continue
        if nodes < 2:
            errors.append(f"{where}: numNodes {nodes}: the chief and at least one worker")
            continue
        job = [j for j in runtime["spec"]["template"]["spec"]["replicatedJobs"]
               if j["name"] == "node"][0]
        container = [c for c in job["template"]["spec"]["template"]["spec"]["containers"]
                     if c["name"] == "node"][0]
        command = container.get("command", [])
        if command[:2] != ["/bin/sh", "-c"]:
            continue
        script = command[2].replace("exec /usr/local/bin/cohort", "printenv TF_CONFIG #")
        hosts = [f"{name}-node-0-{i}.{name}:2222" for i in range(nodes)]
        for i in range(nodes):
            import subprocess
            run = subprocess.run(
                ["/bin/sh", "-c", script], capture_output=True, text=True, timeout=10,
                env={"PATH": "/usr/bin:/bin", "COHORT_NUM_NODES": str(nodes),
                     "COHORT_NODE_INDEX": str(i), "COHORT_JOBSET": name},
            )
            try:
                tf_config = json.loads(run.stdout)
            except json.JSONDecodeError:
                errors.append(f"{where}: node {i}: the script printed no TF_CONFIG: "
                              f"{run.stdout!r} {run.stderr!r}")
                continue
            want = {
                "cluster": {"chief": hosts[:1], "worker": hosts[1:]},
                "task": {"type": "chief" if i == 0 else "worker", "index": max(i - 1, 0)},
            }
            if tf_config != want:
                errors.append(f"{where}: node {i}: TF_CONFIG {tf_config}, expected {want}")
    return errors


def cohort_configs(docs):
    """The cohort.toml files that ConfigMaps in the same file hold, by ConfigMap name."""
    configs = {}
    for doc in docs:
        if doc.get("kind") == "ConfigMap" and "cohort.toml" in doc.get("data", {}):
            configs[doc["metadata"]["name"]] = doc["data"]["cohort.toml"]
    return configs


def cohort_pod_errors(where, template, configs):
    """cohort's requirements of a pod template whose container runs the cohort binary."""
    spec = template.get("spec", {})
    errors = []
    for i, c in enumerate(spec.get("containers", [])):
        if not any("cohort" in part for part in c.get("command", []) + c.get("args", [])):
            continue
        here = f"{where}.spec.containers[{i}]"
        if not any(p.get("protocol") == "UDP" for p in c.get("ports", [])):
            errors.append(f"{here}.ports: no UDP port (cohort's nodes talk QUIC over UDP)")
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        try:
            grace, source = preemption_grace(env, spec, configs)
        except ValueError as e:
            errors.append(f"{here}: {e}")
            continue
        errors += resource_errors(here, c.get("resources", {}))
        errors += probe_errors(here, c, env, spec, configs)
        termination = spec.get("terminationGracePeriodSeconds", DEFAULT_TERMINATION_GRACE_S)
        if termination <= grace:
            errors.append(f"{where}.spec.terminationGracePeriodSeconds: {termination}s is not "
                          f"above preemption_grace ({grace:g}s, {source}): the kubelet would "
                          "kill the process before its preemption checkpoint")
    return errors


def resource_errors(here, resources):
    """Requests equal to limits for CPU and memory (Guaranteed QoS): a task is not throttled
    below what the scheduler placed it for, and its compute threads follow its CPU limit."""
    errors = []
    requests, limits = resources.get("requests", {}), resources.get("limits", {})
    for key in ("cpu", "memory"):
        if key not in requests or key not in limits:
            errors.append(f"{here}.resources: {key} needs both a request and a limit")
        elif str(requests[key]) != str(limits[key]):
            errors.append(f"{here}.resources: {key} request {requests[key]} is not its "
                          f"limit {limits[key]}")
    return errors


def probe_errors(here, container, env, spec, configs):
    """Metrics on, and liveness and readiness probes asking /healthz on the metrics port."""
    addr = env.get("COHORT_METRICS_ADDR")
    if addr is None:
        for volume in spec.get("volumes", []):
            name = volume.get("configMap", {}).get("name")
            if name in configs:
                try:
                    addr = tomllib.loads(configs[name]).get("metrics_addr")
                except tomllib.TOMLDecodeError:
                    pass  # said by preemption_grace
    if addr is None:
        return [f"{here}: metrics are off (no COHORT_METRICS_ADDR, no metrics_addr in its "
                "cohort.toml): no /healthz for the probes, no metrics"]
    port = int(str(addr).rsplit(":", 1)[-1])
    named = {p.get("name"): p.get("containerPort") for p in container.get("ports", [])}
    errors = []
    for probe in ("livenessProbe", "readinessProbe"):
        get = container.get(probe, {}).get("httpGet")
        if get is None:
            errors.append(f"{here}.{probe}: no httpGet of /healthz")
            continue
        target = named.get(get.get("port"), get.get("port"))
        if get.get("path") != "/healthz" or target != port:
            errors.append(f"{here}.{probe}: asks {get.get('path')} on port {target}, not "
                          f"/healthz on the metrics port {port}")
    return errors


def preemption_grace(env, spec, configs):
    """cohort's preemption_grace in seconds for a container, and where it came from."""
    if env.get("COHORT_PREEMPTION_GRACE"):
        return seconds(env["COHORT_PREEMPTION_GRACE"]), "COHORT_PREEMPTION_GRACE"
    for volume in spec.get("volumes", []):
        name = volume.get("configMap", {}).get("name")
        if name in configs:
            try:
                config = tomllib.loads(configs[name])
            except tomllib.TOMLDecodeError as e:
                raise ValueError(f"ConfigMap {name}: cohort.toml: {e}")
            if "preemption_grace" in config:
                return seconds(config["preemption_grace"]), f"ConfigMap {name}"
    return DEFAULT_PREEMPTION_GRACE_S, "cohort's default"


def seconds(text):
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)", str(text).strip())
    if not match:
        raise ValueError(f"preemption_grace {text!r} is not a duration such as 20s")
    return float(match[1]) * units[match[2]]


def check_indexed_jobs(docs, configs):
    """An Indexed Job's pod i is `<job>-<i>.<subdomain>`: the cluster spec must list exactly
    those names, in index order, for the Job's task type, and the subdomain must be a headless
    Service of the file."""
    errors = []
    services = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "Service"}
    for doc in docs:
        spec = doc.get("spec", {})
        if doc.get("kind") != "Job" or spec.get("completionMode") != "Indexed":
            continue
        name = doc["metadata"]["name"]
        pod = spec["template"]["spec"]
        subdomain = pod.get("subdomain")
        service = services.get(subdomain)
        if service is None or service["spec"].get("clusterIP") != "None":
            errors.append(f"Job/{name}: subdomain {subdomain!r} is not a headless Service here")
            continue
        for c in pod.get("containers", []):
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            task_type = env.get("COHORT_TASK_TYPE")
            if task_type is None:
                continue
            config_names = [v["configMap"]["name"] for v in pod.get("volumes", [])
                            if v.get("configMap", {}).get("name") in configs]
            if not config_names:
                errors.append(f"Job/{name}: mounts no ConfigMap with a cohort.toml")
                continue
            cluster = tomllib.loads(configs[config_names[0]]).get("cluster", {})
            listed = [addr.rsplit(":", 1)[0] for addr in cluster.get(task_type, [])]
            expected = [f"{name}-{i}.{subdomain}" for i in range(spec.get("completions", 1))]
            if listed != expected:
                errors.append(f"Job/{name}: cohort.toml cluster.{task_type} lists {listed}, "
                              f"but the Job's pods are {expected}")
    return errors


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(f"usage: {sys.argv[0]} MANIFEST.yaml...")
    sys.exit(main(sys.argv[1:]))
