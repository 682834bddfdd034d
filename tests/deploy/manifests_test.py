#!/usr/bin/python3
"""Offline checks of deploy/kubernetes: every overlay and example renders
with `kubectl kustomize`, every object validates against the Kubernetes API
schemas and the cert-manager and Prometheus Operator CRDs
(deploy/kubernetes/validate/validate.py, on PyPI's kubernetes-validate), the
validator refuses deliberately broken objects, and the manifests agree with
the binaries and with each other:

  - every CAIRN_* setting (ConfigMaps, env) is a flag of the binary it is
    given to (a typo would otherwise be ignored): checked against the built
    binaries' --help;
  - probes and Services point at declared container ports, and the gRPC
    probe ports are the ones the daemons are configured to listen on;
  - terminationGracePeriodSeconds outlasts cairnd's --shutdown-grace;
  - pods run as non-root with a read-only root filesystem, no privilege
    escalation, all capabilities dropped (an init container may add CHOWN
    only), memory limits set, and no Service environment variables;
  - the agent's memory limit covers its staging budget (staged shared
    memory is charged to it);
  - image tags are the VERSION the images are built as;
  - monitoring: the PodMonitors (deploy/kubernetes/monitoring) and the plain
    Prometheus scrape jobs (deploy/prometheus/prometheus.yaml) select the
    daemons' pods and their metrics ports and label them with the job names
    the alert rules (deploy/prometheus/cairn-alerts.yaml) select, and the
    scrape config passes `promtool check config` (its Kubernetes service
    discovery swapped for static targets: Debian's Prometheus is built
    without it).

Usage: manifests_test.py --build-dir BUILD [--python PYTHON]
(PYTHON: the interpreter with kubernetes-validate that runs the validator;
default the one running this test)
"""

import argparse
import copy
import os
import re
import subprocess
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KUSTOMIZATIONS = [
    "deploy/kubernetes/overlays/dev",
    "deploy/kubernetes/overlays/local",
    "deploy/kubernetes/overlays/s3",
    "deploy/kubernetes/examples/train-job",
]
# Overlays that must serve TLS with tokens (components/security).
SECURED = ["deploy/kubernetes/overlays/local", "deploy/kubernetes/overlays/s3"]
# Settings naming a file the daemon reads (from a mounted Secret).
FILE_SETTINGS = ["CAIRN_TLS_CERT", "CAIRN_TLS_KEY", "CAIRN_TLS_CLIENT_CA", "CAIRN_TLS_CA", "CAIRN_AUTH_TOKENS",
                 "CAIRN_TOKEN_FILE", "CAIRN_PEER_TOKEN_FILE", "CAIRN_PEER_TLS_CA", "CAIRN_PEER_TLS_CERT",
                 "CAIRN_PEER_TLS_KEY"]
# Settings whose file holds a secret: never readable by others.
SECRET_SETTINGS = {"CAIRN_TLS_KEY", "CAIRN_AUTH_TOKENS", "CAIRN_TOKEN_FILE", "CAIRN_PEER_TOKEN_FILE",
                   "CAIRN_PEER_TLS_KEY"}
BINARIES = {"cairnd": "server/coordinator/cairnd", "cairn-agent": "server/agent/cairn-agent"}
VALIDATOR = os.path.join(ROOT, "deploy/kubernetes/validate/validate.py")
errors = []
# The rendered objects of each kustomization, by path (for the validator's negative cases).
rendered_docs = {}


def error(msg):
    errors.append(msg)
    print(f"manifests_test: ERROR: {msg}", flush=True)


def quantity_bytes(q):
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti)?", str(q))
    if not m:
        raise ValueError(f"quantity {q} not understood")
    return int(m.group(1)) * {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}[m.group(2)]


def flags_of(binary):
    out = subprocess.run([binary, "--help"], capture_output=True, text=True, check=True).stdout
    return {"CAIRN_" + f[2:].replace("-", "_").upper() for f in re.findall(r"--[a-z][a-z0-9-]+", out)}


def listen_port(value):
    host, _, port = value.rpartition(":")
    return int(port) if host and port.isdigit() else None


def render_and_validate(path, build_dir, python):
    """The rendered objects of kustomization `path`, validated against the API schemas."""
    out = subprocess.run(["kubectl", "kustomize", os.path.join(ROOT, path)], capture_output=True, text=True)
    if out.returncode != 0:
        error(f"{path}: kubectl kustomize failed: {out.stderr}")
        return []
    rendered = os.path.join(build_dir, "deploy-rendered-" + path.replace("/", "_") + ".yaml")
    with open(rendered, "w") as f:
        f.write(out.stdout)
    v = subprocess.run([python, VALIDATOR, rendered], capture_output=True, text=True)
    print(v.stdout.strip().splitlines()[-1] if v.stdout else v.stderr)
    if v.returncode != 0:
        error(f"{path}: schema validation failed:\n{v.stdout}{v.stderr}")
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    rendered_docs[path] = docs
    return docs


def check_validator_refuses(build_dir, python):
    """The validator refuses broken objects, each with a line naming it and what is wrong."""
    def broken(path, kind, suffix, spoil):
        found = [d for d in rendered_docs.get(path, []) if d["kind"] == kind]
        if not found:
            error(f"validator negative case: {path} rendered no {kind} to break")
            return None
        obj = copy.deepcopy(found[0])
        obj["metadata"]["name"] += suffix
        spoil(obj["spec"])
        return obj

    def unknown_field(spec):
        spec["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"

    def wrong_type(spec):
        spec["podMetricsEndpoints"][0]["port"] = 9090

    # (object, what the validator's line for it must say)
    cases = [
        (broken("deploy/kubernetes/overlays/dev", "DaemonSet", "-unknown-field", unknown_field),
         "spec.template.spec.containers[0]: Additional properties are not allowed ('imagePullPolicyy'"),
        (broken("deploy/kubernetes/monitoring", "PodMonitor", "-wrong-type", wrong_type),
         "spec.podMetricsEndpoints[0].port: 9090 is not of type 'string'"),
        (broken("deploy/kubernetes/overlays/local", "Certificate", "-no-secret-name",
                lambda spec: spec.pop("secretName")),
         "spec: 'secretName' is a required property"),
    ]
    cases = [(o, want) for o, want in cases if o is not None]
    if not cases:
        return
    path = os.path.join(build_dir, "deploy-broken-objects.yaml")
    with open(path, "w") as f:
        yaml.safe_dump_all([o for o, _ in cases], f)
    v = subprocess.run([python, VALIDATOR, path], capture_output=True, text=True)
    lines = v.stdout.splitlines()
    problems = [] if v.returncode == 1 else [f"exit {v.returncode}, not 1"]
    for o, want in cases:
        what = f"{path}: {o['kind']}/{o['metadata']['name']}: INVALID: "
        if not any(l.startswith(what) and want in l for l in lines):
            problems.append(f"no line {what}{want}...")
    if f"validate: 0 valid, {len(cases)} invalid" not in lines:
        problems.append(f"not the summary validate: 0 valid, {len(cases)} invalid")
    if problems:
        error(f"validator on {len(cases)} broken objects: " + "; ".join(problems) + f":\n{v.stdout}{v.stderr}")
    else:
        print(f"validator refuses {len(cases)} broken objects")


def check_kustomization(path, build_dir, python, version, flags):
    docs = render_and_validate(path, build_dir, python)
    if not docs:
        return []
    config_maps = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
    workloads = [d for d in docs if d["kind"] in ("StatefulSet", "DaemonSet", "Deployment", "Job")]
    if not workloads:
        error(f"{path}: no workloads rendered")
    for w in workloads:
        check_workload(path, w, config_maps, version, flags)
        check_files(path, w, config_maps, docs)
    if path in SECURED:
        check_secured(path, workloads, config_maps, docs)
    for svc in (d for d in docs if d["kind"] == "Service"):
        targets = [w for w in workloads
                   if all(w["spec"]["template"]["metadata"].get("labels", {}).get(k) == val
                          for k, val in svc["spec"]["selector"].items())]
        if not targets:
            error(f"{path}: Service {svc['metadata']['name']} selects no workload")
        for t in targets:
            ports = {p.get("name"): p["containerPort"]
                     for c in t["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}
            for p in svc["spec"]["ports"]:
                tp = p.get("targetPort", p["port"])
                if (tp not in ports) and (tp not in ports.values()):
                    error(f"{path}: Service {svc['metadata']['name']} port {p['port']} targets {tp}, "
                          f"not a port of {t['metadata']['name']}")
    for pdb in (d for d in docs if d["kind"] == "PodDisruptionBudget"):
        sel = pdb["spec"]["selector"]["matchLabels"]
        if not any(all(w["spec"]["template"]["metadata"].get("labels", {}).get(k) == val for k, val in sel.items())
                   for w in workloads):
            error(f"{path}: PodDisruptionBudget {pdb['metadata']['name']} selects no workload")
    return workloads


def container_env(c, config_maps):
    env = {}
    for src in c.get("envFrom", []):
        if "configMapRef" in src:
            env.update(config_maps.get(src["configMapRef"]["name"], {}))
    for e in c.get("env", []):
        env[e["name"]] = e.get("value", "<from " + ",".join(e.get("valueFrom", {})) + ">")
    return env


def check_files(path, w, config_maps, docs):
    """Every file a daemon is told to read is in a volume it mounts, with a mode it can read and others cannot."""
    spec = w["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    cert_secrets = {d["spec"]["secretName"] for d in docs if d["kind"] == "Certificate"}
    fs_group = spec.get("securityContext", {}).get("fsGroup")
    for c in spec["containers"]:
        env = container_env(c, config_maps)
        cname = f"{path}: {w['kind']}/{w['metadata']['name']}/{c['name']}"
        for key in FILE_SETTINGS:
            file = env.get(key)
            if file is None:
                continue
            mounts = [m for m in c.get("volumeMounts", []) if file.startswith(m["mountPath"].rstrip("/") + "/")]
            if not mounts:
                error(f"{cname}: {key}={file} is in no volume the container mounts")
                continue
            m = mounts[0]
            name = os.path.relpath(file, m["mountPath"])
            secret = volumes.get(m["name"], {}).get("secret")
            if secret is None:
                error(f"{cname}: {key}={file} is not from a Secret volume")
                continue
            items = secret.get("items")
            if items is not None:
                if name not in [i["path"] for i in items]:
                    error(f"{cname}: {key}={file}: Secret {secret['secretName']} volume has no item {name}")
            elif secret["secretName"] in cert_secrets and name not in ("tls.crt", "tls.key", "ca.crt"):
                error(f"{cname}: {key}={file}: a cert-manager Secret holds tls.crt, tls.key and ca.crt, not {name}")
            mode = secret.get("defaultMode", 0o644)
            if key in SECRET_SETTINGS and mode & 0o007:
                error(f"{cname}: {key}={file} is readable by others (defaultMode {oct(mode)})")
            if not mode & 0o004 and not (fs_group is not None and mode & 0o040):
                error(f"{cname}: {key}={file}: mode {oct(mode)} without fsGroup: the daemon cannot read it")


def check_secured(path, workloads, config_maps, docs):
    """A secured overlay: cairnd serves TLS with tokens, probes a plaintext health port, and agents trust it."""
    cairnd = [w for w in workloads if w["metadata"]["name"] == "cairnd"]
    agents = [w for w in workloads if w["metadata"]["name"] == "cairn-agent"]
    if len(cairnd) != 1 or len(agents) != 1:
        error(f"{path}: expected one cairnd and one cairn-agent")
        return
    env = container_env(cairnd[0]["spec"]["template"]["spec"]["containers"][0], config_maps)
    for key in ("CAIRN_TLS_CERT", "CAIRN_TLS_KEY", "CAIRN_AUTH_TOKENS", "CAIRN_HEALTH_LISTEN"):
        if key not in env:
            error(f"{path}: cairnd has no {key}")
    if env.get("CAIRN_ALLOW_INSECURE", "false") != "false":
        error(f"{path}: cairnd allows plaintext (CAIRN_ALLOW_INSECURE={env.get('CAIRN_ALLOW_INSECURE')})")
    certs = [d for d in docs if d["kind"] == "Certificate"
             and os.path.dirname(env.get("CAIRN_TLS_CERT", "")) and d["spec"]["secretName"] == "cairnd-tls"]
    names = set(certs[0]["spec"].get("dnsNames", [])) if certs else set()
    agent_env = container_env(agents[0]["spec"]["template"]["spec"]["containers"][0], config_maps)
    for key in ("CAIRN_TLS_CA", "CAIRN_TOKEN_FILE"):
        if key not in agent_env:
            error(f"{path}: cairn-agent has no {key}")
    host = agent_env.get("CAIRN_COORDINATOR", "").rpartition(":")[0]
    if host not in names:
        error(f"{path}: the agents call cairnd as {host!r}, which cairnd's certificate does not name ({sorted(names)})")


def pod_labels(w):
    return w["spec"]["template"]["metadata"].get("labels", {})


def port_names(w):
    return {p.get("name") for c in w["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}


def check_monitoring(build_dir, python, workloads):
    """PodMonitors and plain scrape jobs agree with the pods and the alert rules."""
    daemons = [w for w in workloads if w["kind"] in ("StatefulSet", "DaemonSet")]
    rules = open(os.path.join(ROOT, "deploy/prometheus/cairn-alerts.yaml")).read()
    alert_jobs = set(re.findall(r'job="([^"]+)"', rules))
    if not alert_jobs:
        error("cairn-alerts.yaml: no rule selects a job")
    # The Prometheus Operator's PodMonitors: the job label is the value of
    # the pod label named by jobLabel.
    monitor_jobs = set()
    monitors = render_and_validate("deploy/kubernetes/monitoring", build_dir, python)
    for pm in (d for d in monitors if d["kind"] == "PodMonitor"):
        name = f"PodMonitor/{pm['metadata']['name']}"
        sel = pm["spec"]["selector"]["matchLabels"]
        hits = [w for w in daemons if all(pod_labels(w).get(k) == v for k, v in sel.items())]
        if len(hits) != 1:
            error(f"{name}: selects {len(hits)} workloads, not one")
            continue
        for ep in pm["spec"]["podMetricsEndpoints"]:
            # check_workload ties the port named metrics to CAIRN_METRICS_LISTEN.
            if ep.get("port") != "metrics" or "metrics" not in port_names(hits[0]):
                error(f"{name}: scrapes port {ep.get('port')}, not {hits[0]['metadata']['name']}'s metrics port")
        monitor_jobs.add(pod_labels(hits[0]).get(pm["spec"].get("jobLabel", ""), f"cairn/{pm['metadata']['name']}"))
    if monitor_jobs != alert_jobs:
        error(f"PodMonitors label jobs {sorted(monitor_jobs)}, the alert rules select {sorted(alert_jobs)}")
    # Plain Prometheus: each job's keep rules on the pod label and the port
    # name must let through exactly its daemon's metrics port.
    config_path = os.path.join(ROOT, "deploy/prometheus/prometheus.yaml")
    config = yaml.safe_load(open(config_path))
    scrape_jobs = set()
    static = dict(config)
    static["rule_files"] = [os.path.join(ROOT, "deploy/prometheus", f) for f in config.get("rule_files", [])]
    static["scrape_configs"] = []
    for job in config["scrape_configs"]:
        scrape_jobs.add(job["job_name"])
        kept = []
        for w in daemons:
            for port in port_names(w):
                meta = {"__meta_kubernetes_pod_container_port_name": port}
                for k, v in pod_labels(w).items():
                    meta["__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", k)] = v
                if all(rule.get("action") != "keep" or
                       re.fullmatch(rule["regex"], ";".join(meta.get(l, "") for l in rule["source_labels"]))
                       for rule in job.get("relabel_configs", [])):
                    kept.append((w["metadata"]["name"], port))
        if kept != [(job["job_name"], "metrics")]:
            error(f"prometheus.yaml: job {job['job_name']} keeps {kept}, not the {job['job_name']} pods' metrics port")
        swapped = {k: v for k, v in job.items() if k != "kubernetes_sd_configs"}
        swapped["static_configs"] = [{"targets": ["127.0.0.1:9"]}]
        static["scrape_configs"].append(swapped)
    if scrape_jobs != alert_jobs:
        error(f"prometheus.yaml scrapes jobs {sorted(scrape_jobs)}, the alert rules select {sorted(alert_jobs)}")
    static_path = os.path.join(build_dir, "deploy-prometheus-static.yaml")
    with open(static_path, "w") as f:
        yaml.safe_dump(static, f)
    p = subprocess.run(["/usr/bin/promtool", "check", "config", static_path], capture_output=True, text=True)
    if p.returncode != 0:
        error(f"prometheus.yaml (service discovery swapped for static targets): promtool check config:\n"
              f"{p.stdout}{p.stderr}")


def check_workload(path, w, config_maps, version, flags):
    name = f"{path}: {w['kind']}/{w['metadata']['name']}"
    spec = w["spec"]["template"]["spec"]
    psc = spec.get("securityContext", {})
    if spec.get("enableServiceLinks") is not False:
        error(f"{name}: enableServiceLinks must be false (Service variables would look like CAIRN_* flags)")
    if not psc.get("runAsNonRoot") or psc.get("runAsUser", 0) == 0:
        error(f"{name}: pod must run as a non-root user")
    for c in spec.get("initContainers", []) + spec["containers"]:
        cname = f"{name}/{c['name']}"
        is_init = c in spec.get("initContainers", [])
        csc = c.get("securityContext", {})
        if not csc.get("readOnlyRootFilesystem"):
            error(f"{cname}: readOnlyRootFilesystem must be true")
        if csc.get("allowPrivilegeEscalation") is not False:
            error(f"{cname}: allowPrivilegeEscalation must be false")
        caps = csc.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            error(f"{cname}: capabilities must drop ALL")
        if caps.get("add", []) not in ([], ["CHOWN"]) or (caps.get("add") and not is_init):
            error(f"{cname}: only an init container may add a capability, and only CHOWN")
        if not is_init and csc.get("runAsUser", psc.get("runAsUser")) == 0:
            error(f"{cname}: runs as root")
        image = c["image"]
        if not image.endswith(":" + version):
            error(f"{cname}: image {image} is not tagged with VERSION {version}")
        if is_init:
            continue
        if "memory" not in c.get("resources", {}).get("limits", {}):
            error(f"{cname}: no memory limit")
        binary = os.path.basename(c["command"][0])
        env = {}
        for src in c.get("envFrom", []):
            if "configMapRef" in src:
                cm = src["configMapRef"]["name"]
                if cm not in config_maps:
                    error(f"{cname}: envFrom ConfigMap {cm} is not rendered")
                env.update(config_maps.get(cm, {}))
        for e in c.get("env", []):
            env[e["name"]] = e.get("value", "<from " + ",".join(e.get("valueFrom", {})) + ">")
        if binary in flags:
            known = flags[binary] | {"CAIRN_PEER_TOKEN"}
            for k in env:
                if k.startswith("CAIRN_") and k not in known:
                    error(f"{cname}: {k} is not a setting of {binary} (no --{k[6:].lower().replace('_', '-')})")
        ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = c.get(kind)
            if binary in flags and probe is None:
                error(f"{cname}: no {kind}")
                continue
            if probe is None:
                continue
            handler = probe.get("grpc") or probe.get("httpGet") or probe.get("tcpSocket")
            port = handler["port"]
            if port not in ports.values() and port not in ports:
                error(f"{cname}: {kind} port {port} is not a container port")
            if "grpc" in probe:
                # cairnd serves health on its main port and on CAIRN_HEALTH_LISTEN; the agent only there.
                listens = [env.get("CAIRN_HEALTH_LISTEN")]
                if binary == "cairnd" and "CAIRN_TLS_CERT" not in env:
                    listens.append(env.get("CAIRN_LISTEN"))
                if port not in [listen_port(v) for v in listens if v]:
                    error(f"{cname}: {kind} probes port {port}, but the daemon serves plaintext health on "
                          f"{[v for v in listens if v]} (the kubelet's gRPC probe speaks no TLS)")
        if binary == "cairnd":
            grace = spec.get("terminationGracePeriodSeconds", 30)
            drain = float(env.get("CAIRN_SHUTDOWN_GRACE", 10))
            if grace <= drain:
                error(f"{cname}: terminationGracePeriodSeconds {grace} <= CAIRN_SHUTDOWN_GRACE {drain}")
        if binary == "cairn-agent":
            budget = int(env.get("CAIRN_STAGING_BUDGET_MIB", 1024)) << 20
            limit = quantity_bytes(c["resources"]["limits"]["memory"])
            if limit < budget + (256 << 20):
                error(f"{cname}: memory limit {limit >> 20} MiB does not cover the staging budget "
                      f"{budget >> 20} MiB plus the agent itself")
        if binary in flags and ports.get("metrics") != listen_port(env.get("CAIRN_METRICS_LISTEN", "")):
            error(f"{cname}: the port named metrics ({ports.get('metrics')}) is not where "
                  f"CAIRN_METRICS_LISTEN={env.get('CAIRN_METRICS_LISTEN')} serves")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--python", default=sys.executable,
                    help="the interpreter (with kubernetes-validate) that runs the validator")
    args = ap.parse_args()
    version = open(os.path.join(ROOT, "VERSION")).read().strip()
    probe = subprocess.run([args.python, "-c", "import kubernetes_validate"], capture_output=True, text=True)
    if probe.returncode != 0:
        error(f"{args.python} cannot import kubernetes_validate: scripts/install_deps.sh installs it into "
              f".venv (pinned kubernetes-validate):\n{probe.stderr}")
        return 1
    flags = {b: flags_of(os.path.join(args.build_dir, p)) for b, p in BINARIES.items()}
    for path in KUSTOMIZATIONS:
        workloads = check_kustomization(path, args.build_dir, args.python, version, flags)
        if path == "deploy/kubernetes/overlays/dev":
            check_monitoring(args.build_dir, args.python, workloads)
    check_validator_refuses(args.build_dir, args.python)
    if errors:
        print(f"manifests_test: FAIL: {len(errors)} problem(s)")
        return 1
    print(f"manifests_test: PASS: {len(KUSTOMIZATIONS)} kustomizations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
