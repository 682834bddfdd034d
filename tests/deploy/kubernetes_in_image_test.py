#!/usr/bin/python3
"""Runs the rendered Kubernetes manifests' containers in the built image.

No Kubernetes API server is packaged here, so this test does the kubelet's
part itself, from the manifests `kubectl kustomize` renders (the dev overlay
and the example training Job), so manifests, image and binaries cannot drift:

  1. One podman pod (one network namespace, loopback only) stands in for a
     node; Service names the manifests use resolve to 127.0.0.1 there.
  2. For cairnd's StatefulSet and the agents' DaemonSet: each container's
     exact image, command, args and env (ConfigMaps through envFrom, the
     downward API, $(VAR) expansion), its securityContext (user, group,
     read-only root filesystem, dropped capabilities) and its volumes
     (hostPath, PVC and emptyDir as host directories) become `podman run`
     arguments. Init containers run first and must succeed.
  3. Probes as the kubelet does them: the startup probe until it passes
     (bounded), then readiness and liveness; gRPC probes are
     grpc.health.v1.Health/Check from inside the pod's network namespace.
  4. The indexed training Job's pods (one per completion index) run
     train.py with the Python package: they save through the agent and
     cairnd; a second run of the Job resumes from (loads) the latest
     checkpoint. `cairn verify` in the image checks the stored data.
  5. SIGTERM with the manifest's terminationGracePeriodSeconds: each daemon
     must exit 0 before the grace period ends (podman stop sends SIGKILL at
     the end of it, which would show as exit code 137).

Needs root, podman, the images deploy/image/build.sh makes (the test fails
with the command to run if they are missing or older than the sources).
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NODE_NAME = "node-0"
POD_IP = "127.0.0.1"
PROBE_CAP_S = 180  # a startup probe may allow 30 min; a test waits this long


class Failure(Exception):
    pass


def run(cmd, check=True, capture=True, timeout=600, env=None):
    p = subprocess.run(cmd, capture_output=capture, text=True, timeout=timeout, env=env)
    if check and p.returncode != 0:
        raise Failure(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p


def render(path):
    out = run(["kubectl", "kustomize", os.path.join(ROOT, path)]).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def find(docs, kind, name=None):
    hits = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    if len(hits) != 1:
        raise Failure(f"expected one {kind} {name or ''}, found {len(hits)}")
    return hits[0]


def image_ref(image, version):
    # kustomize rewrote `cairn` to localhost/cairn:<tag>; the tag must be the
    # version the images are built as.
    name, _, tag = image.rpartition(":")
    if tag != version:
        raise Failure(f"manifest image {image}: tag {tag} is not VERSION {version}")
    return image


class Pod:
    """A podman pod standing in for one Kubernetes node's network."""

    def __init__(self, name, workdir, hosts):
        self.name = name
        self.workdir = workdir
        self.containers = []
        self.hosts_file = os.path.join(workdir, "hosts")
        with open(self.hosts_file, "w") as f:
            f.write("127.0.0.1 localhost\n")
            for h in hosts:
                f.write(f"127.0.0.1 {h}\n")
        os.chmod(self.hosts_file, 0o644)
        run(["podman", "pod", "rm", "-f", name], check=False)
        run(["podman", "pod", "create", "--name", name, "--network", "none"])
        infra = run(["podman", "pod", "inspect", name, "--format", "{{.InfraContainerID}}"]).stdout.strip()
        run(["podman", "pod", "start", name])
        self.pid = run(["podman", "inspect", "--format", "{{.State.Pid}}", infra]).stdout.strip()

    def remove(self):
        run(["podman", "pod", "rm", "-f", "-t", "0", self.name], check=False)

    def probe_grpc(self, port, service=""):
        """grpc.health.v1 Check from inside the pod's network namespace."""
        code = (
            "import grpc,sys\n"
            f"ch=grpc.insecure_channel('127.0.0.1:{port}')\n"
            "f=ch.unary_unary('/grpc.health.v1.Health/Check',"
            "request_serializer=lambda b:b,response_deserializer=lambda b:b)\n"
            f"req=b'' if not {service!r} else b'\\x0a'+bytes([len({service!r})])+{service!r}.encode()\n"
            "try:\n"
            "  r=f(req,timeout=3)\n"
            "except grpc.RpcError as e:\n"
            "  print('rpc error',e.code()); sys.exit(2)\n"
            # HealthCheckResponse{status=1}: field 1 varint 1 = SERVING.
            "print('status', r[1] if len(r)>1 else 0); sys.exit(0 if r==b'\\x08\\x01' else 1)\n")
        p = run(["nsenter", "-t", self.pid, "-n", "/usr/bin/python3", "-c", code], check=False, timeout=30)
        return p.returncode == 0, (p.stdout + p.stderr).strip()

    def probe(self, container, probe, port_names):
        if "grpc" in probe:
            port = probe["grpc"]["port"]
            return self.probe_grpc(port, probe["grpc"].get("service", ""))
        if "tcpSocket" in probe or "httpGet" in probe:
            spec = probe.get("tcpSocket") or probe.get("httpGet")
            port = spec["port"]
            if isinstance(port, str):
                port = port_names[port]
            code = f"import socket; socket.create_connection(('127.0.0.1', {port}), 3)"
            p = run(["nsenter", "-t", self.pid, "-n", "/usr/bin/python3", "-c", code], check=False, timeout=30)
            return p.returncode == 0, p.stderr.strip()
        raise Failure(f"{container}: probe kind not handled here: {probe}")


class Volumes:
    """Host directories for a pod template's volumes (one node: hostPaths
    with the same path are the same directory across pods)."""

    def __init__(self, workdir, secrets):
        self.workdir = workdir
        self.secrets = secrets
        self.host_paths = {}

    def host_path(self, path, kind):
        if path not in self.host_paths:
            d = os.path.join(self.workdir, "node" + path.replace("/", "_"))
            if path == "/dev/shm":
                # The node's /dev/shm is a tmpfs open to everyone (sticky).
                d = tempfile.mkdtemp(prefix="cairn-k8s-shm-", dir="/dev/shm")
                os.chmod(d, 0o1777)
            elif kind == "Directory":
                raise Failure(f"hostPath {path} (type Directory) does not exist on the node")
            else:
                os.makedirs(d, exist_ok=True)  # DirectoryOrCreate: root, 0755
                os.chmod(d, 0o755)
            self.host_paths[path] = d
        return self.host_paths[path]

    def for_pod(self, pod_name, spec, claims):
        fs_group = spec.get("securityContext", {}).get("fsGroup")
        out = {}
        for v in spec.get("volumes", []):
            name = v["name"]
            if "hostPath" in v:
                out[name] = self.host_path(v["hostPath"]["path"], v["hostPath"].get("type", ""))
            elif "persistentVolumeClaim" in v:
                out[name] = self.claim(v["persistentVolumeClaim"]["claimName"], fs_group)
            elif "emptyDir" in v:
                d = os.path.join(self.workdir, f"{pod_name}-{name}")
                os.makedirs(d, exist_ok=True)
                os.chmod(d, 0o1777 if fs_group is None else 0o2775)
                if fs_group is not None:
                    os.chown(d, 0, fs_group)
                out[name] = d
            elif "secret" in v:
                out[name] = self.secret(pod_name, name, v["secret"], fs_group)
            else:
                raise Failure(f"{pod_name}: volume {name}: kind not handled here: {v}")
        for name in claims:
            out[name] = self.claim(f"{name}-{pod_name}", fs_group)
        return out

    def secret(self, pod_name, name, spec, fs_group):
        """A Secret volume as the kubelet writes it: root-owned files with
        the volume's mode, group fsGroup when the pod has one."""
        data = self.secrets.get(spec["secretName"])
        if data is None:
            raise Failure(f"{pod_name}: volume {name}: Secret {spec['secretName']} does not exist")
        items = spec.get("items") or [{"key": k, "path": k} for k in data]
        d = os.path.join(self.workdir, f"{pod_name}-{name}")
        os.makedirs(d, exist_ok=True)
        os.chmod(d, 0o755)
        for item in items:
            f = os.path.join(d, item["path"])
            with open(f, "w") as out:
                out.write(data[item["key"]])
            os.chown(f, 0, fs_group if fs_group is not None else 0)
            os.chmod(f, item.get("mode", spec.get("defaultMode", 0o644)))
        return d

    def claim(self, claim, fs_group):
        # A PVC is a fresh volume; the kubelet gives fsGroup ownership.
        d = os.path.join(self.workdir, "pvc-" + claim)
        if not os.path.isdir(d):
            os.makedirs(d)
            os.chmod(d, 0o2775)
            if fs_group is not None:
                os.chown(d, 0, fs_group)
        return d


def expand(value, env):
    # Kubernetes $(VAR) expansion from earlier variables; $$ escapes.
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), value)


def container_env(c, config_maps, secrets, pod_fields, where):
    env = {}
    for src in c.get("envFrom", []):
        if "configMapRef" in src:
            name = src["configMapRef"]["name"]
            if name not in config_maps:
                raise Failure(f"{where}: envFrom ConfigMap {name} is not in the rendered manifests")
            env.update(config_maps[name])
        elif "secretRef" in src:
            name = src["secretRef"]["name"]
            if name in secrets:
                env.update(secrets[name])
            elif not src["secretRef"].get("optional"):
                raise Failure(f"{where}: envFrom Secret {name} is required")
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = expand(e["value"], env)
        elif "valueFrom" in e:
            vf = e["valueFrom"]
            if "fieldRef" in vf:
                path = vf["fieldRef"]["fieldPath"]
                if path not in pod_fields:
                    raise Failure(f"{where}: env {e['name']}: field {path} not known to this test")
                env[e["name"]] = pod_fields[path]
            elif "secretKeyRef" in vf:
                ref = vf["secretKeyRef"]
                if ref["name"] in secrets:
                    env[e["name"]] = secrets[ref["name"]][ref["key"]]
                elif not ref.get("optional"):
                    raise Failure(f"{where}: env {e['name']}: Secret {ref['name']} is required")
            elif "configMapKeyRef" in vf:
                ref = vf["configMapKeyRef"]
                env[e["name"]] = config_maps[ref["name"]][ref["key"]]
            else:
                raise Failure(f"{where}: env {e['name']}: source not handled: {vf}")
    return env


def podman_run_args(pod, name, c, spec, volumes, env, image):
    psc = spec.get("securityContext", {})
    csc = c.get("securityContext", {})
    uid = csc.get("runAsUser", psc.get("runAsUser"))
    gid = csc.get("runAsGroup", psc.get("runAsGroup", 0))
    non_root = csc.get("runAsNonRoot", psc.get("runAsNonRoot", False))
    if uid is None:
        raise Failure(f"{name}: no runAsUser: the image's user would decide")
    if non_root and uid == 0:
        raise Failure(f"{name}: runAsNonRoot with runAsUser 0 would not start")
    args = ["podman", "run", "-d", "--pod", pod.name, "--name", f"{pod.name}-{name}",
            "--user", f"{uid}:{gid}", "--security-opt", "no-new-privileges",
            "-v", f"{pod.hosts_file}:/etc/hosts:ro"]
    groups = list(psc.get("supplementalGroups", []))
    if psc.get("fsGroup") is not None:
        groups.append(psc["fsGroup"])
    for g in groups:
        args += ["--group-add", str(g)]
    if csc.get("readOnlyRootFilesystem"):
        args += ["--read-only", "--read-only-tmpfs=false"]
    caps = csc.get("capabilities", {})
    if "ALL" in caps.get("drop", []):
        args += ["--cap-drop", "all"]
    for cap in caps.get("add", []):
        args += ["--cap-add", cap]
    for m in c.get("volumeMounts", []):
        if m["name"] not in volumes:
            raise Failure(f"{name}: volumeMount {m['name']} names no volume of the pod")
        ro = ":ro" if m.get("readOnly") else ""
        args += ["-v", f"{volumes[m['name']]}:{m['mountPath']}{ro}"]
    for k, v in sorted(env.items()):
        args += ["--env", f"{k}={v}"]
    command = c.get("command")
    if not command:
        raise Failure(f"{name}: no command: the image's entrypoint would decide")
    args += ["--entrypoint", json.dumps(command[:1]), image] + command[1:] + [
        expand(a, env) for a in c.get("args", [])]
    return args


def logs(container):
    p = run(["podman", "logs", container], check=False)
    return p.stdout + p.stderr


def wait_exit(container, timeout_s):
    p = run(["podman", "wait", container], check=False, timeout=timeout_s + 30)
    if p.returncode != 0:
        raise Failure(f"{container}: podman wait failed: {p.stderr}")
    return int(p.stdout.strip().splitlines()[-1])


def start_workload(pod, vols, kind_obj, config_maps, secrets, version, pod_fields, say):
    """Runs a StatefulSet/DaemonSet pod: init containers, then the main
    container; returns (container name, container spec, pod spec)."""
    spec = kind_obj["spec"]["template"]["spec"]
    pod_name = kind_obj["metadata"]["name"]
    claims = [t["metadata"]["name"] for t in kind_obj["spec"].get("volumeClaimTemplates", [])]
    volumes = vols.for_pod(pod_name, spec, claims)
    for ic in spec.get("initContainers", []):
        env = container_env(ic, config_maps, secrets, pod_fields, f"{pod_name}/{ic['name']}")
        name = f"{pod_name}-init-{ic['name']}"
        run(podman_run_args(pod, name, ic, spec, volumes, env, image_ref(ic["image"], version)))
        code = wait_exit(f"{pod.name}-{name}", 120)
        if code != 0:
            raise Failure(f"init container {ic['name']} of {pod_name} exited {code}:\n{logs(pod.name + '-' + name)}")
        say(f"{pod_name}: init container {ic['name']} ok")
    if len(spec["containers"]) != 1:
        raise Failure(f"{pod_name}: expected one container")
    c = spec["containers"][0]
    env = container_env(c, config_maps, secrets, pod_fields, f"{pod_name}/{c['name']}")
    run(podman_run_args(pod, pod_name, c, spec, volumes, env, image_ref(c["image"], version)))
    return f"{pod.name}-{pod_name}", c, spec, volumes


def run_probes(pod, container, c, say):
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        if kind not in c:
            raise Failure(f"{container}: no {kind}")
    sp = c["startupProbe"]
    allowed = sp.get("periodSeconds", 10) * sp.get("failureThreshold", 3)
    deadline = time.monotonic() + min(allowed, PROBE_CAP_S)
    attempts = 0
    while True:
        attempts += 1
        ok, out = pod.probe(container, sp, ports)
        if ok:
            break
        state = run(["podman", "inspect", "--format", "{{.State.Status}}", container]).stdout.strip()
        if state != "running":
            raise Failure(f"{container} is {state} before its startup probe passed:\n{logs(container)}")
        if time.monotonic() > deadline:
            raise Failure(f"{container}: startup probe still failing ({out}) after {attempts} attempts:\n{logs(container)}")
        time.sleep(min(sp.get("periodSeconds", 10), 1))
    say(f"{container}: startup probe passed (attempt {attempts})")
    for kind in ("readinessProbe", "livenessProbe"):
        ok, out = pod.probe(container, c[kind], ports)
        if not ok:
            raise Failure(f"{container}: {kind} failed: {out}\n{logs(container)}")
    say(f"{container}: readiness and liveness probes pass")


def run_job(pod, vols, job, config_maps, secrets, version, say, round_no):
    spec = job["spec"]["template"]["spec"]
    completions = job["spec"]["completions"]
    if job["spec"].get("completionMode") != "Indexed":
        raise Failure("the example Job is not indexed")
    volumes = vols.for_pod(job["metadata"]["name"], spec, [])
    c = spec["containers"][0]
    names = []
    for index in range(completions):
        fields = {
            "metadata.annotations['batch.kubernetes.io/job-completion-index']": str(index),
            "spec.nodeName": NODE_NAME,
            "status.podIP": POD_IP,
        }
        env = container_env(c, config_maps, secrets, fields, f"job/{index}")
        name = f"train-{index}-r{round_no}"
        run(podman_run_args(pod, name, c, spec, volumes, env, image_ref(c["image"], version)))
        names.append(f"{pod.name}-{name}")
    out = {}
    for n in names:
        code = wait_exit(n, 900)
        out[n] = logs(n)
        if code != 0:
            raise Failure(f"training pod {n} exited {code}:\n{out[n]}")
    say(f"job round {round_no}: {completions} ranks exited 0")
    return "\n".join(out.values())


def stop_gracefully(container, spec, say):
    grace = spec.get("terminationGracePeriodSeconds", 30)
    run(["podman", "stop", "-t", str(grace), container], check=False, timeout=grace + 60)
    code = int(run(["podman", "inspect", "--format", "{{.State.ExitCode}}", container]).stdout.strip())
    text = logs(container)
    if code != 0:
        raise Failure(f"{container}: after SIGTERM exited {code}, not 0 within "
                      f"terminationGracePeriodSeconds={grace}:\n{text}")
    say(f"{container}: SIGTERM -> exit 0 within {grace} s grace")
    return text


def check_image(version, source_check=True):
    for image in (f"localhost/cairn:{version}", f"localhost/cairn-train:{version}"):
        p = run(["podman", "image", "inspect", image], check=False)
        if p.returncode != 0:
            raise Failure(f"image {image} is missing: build it with deploy/image/build.sh")
        info = json.loads(p.stdout)[0]
        want = run([os.path.join(ROOT, "deploy/image/source-hash.sh")]).stdout.strip()
        got = info.get("Labels", {}).get("dev.cairn.source-hash") or (
            info.get("Config", {}).get("Labels") or {}).get("dev.cairn.source-hash")
        if source_check and got != want:
            raise Failure(f"image {image} was built from other sources ({got}) than "
                          f"this tree ({want}): rebuild with deploy/image/build.sh")
        user = info.get("Config", {}).get("User") or info.get("User", "")
        if not user or user.split(":")[0] in ("0", "root"):
            raise Failure(f"image {image} runs as root (User={user!r})")
    # The runtime image carries no compiler or build tooling.
    p = run(["podman", "run", "--rm", "--entrypoint", '["/usr/bin/test"]', f"localhost/cairn:{version}",
             "-e", "/usr/bin/g++"], check=False)
    if p.returncode == 0:
        raise Failure("the runtime image contains /usr/bin/g++ (the build stage leaked)")


def make_tls_secrets(workdir, names):
    """What cert-manager would put in the Secrets of components/security: a
    CA, cairnd's serving certificate for `names` and the agents' (tls.crt,
    tls.key, ca.crt each), made with openssl."""
    d = os.path.join(workdir, "pki")
    os.makedirs(d)

    def ssl(*args):
        run(["openssl", *args], capture=True)

    ssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
        "-subj", "/CN=cairn-ca", "-keyout", f"{d}/ca.key", "-out", f"{d}/ca.crt")
    out = {}
    for cert, cn, ext in (("cairnd-tls", "cairnd", "subjectAltName=" + ",".join("DNS:" + n for n in names)),
                          ("cairn-agent-tls", "cairn-agent", "extendedKeyUsage=clientAuth,serverAuth")):
        ssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", f"/CN={cn}",
            "-keyout", f"{d}/{cert}.key", "-out", f"{d}/{cert}.csr")
        with open(f"{d}/{cert}.ext", "w") as f:
            f.write(ext + "\n")
        ssl("x509", "-req", "-in", f"{d}/{cert}.csr", "-CA", f"{d}/ca.crt", "-CAkey", f"{d}/ca.key",
            "-CAcreateserial", "-days", "2", "-extfile", f"{d}/{cert}.ext", "-out", f"{d}/{cert}.crt")
        out[cert] = {k: open(f"{d}/{cert}.{ext_}").read()
                     for k, ext_ in (("tls.crt", "crt"), ("tls.key", "key"))}
        out[cert]["ca.crt"] = open(f"{d}/ca.crt").read()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", action="store_true", help="keep the pod and directories")
    ap.add_argument("--skip-source-check", action="store_true",
                    help="accept images built from other sources (debugging the test only)")
    ap.add_argument("--overlay", default="deploy/kubernetes/overlays/dev",
                    help="kustomization to run (default: the dev overlay)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise Failure("needs root (podman pods, nsenter, chown of volumes)")
    os.environ.setdefault("CONTAINERS_CONF", os.path.join(ROOT, "deploy/image/containers.conf"))
    version = open(os.path.join(ROOT, "VERSION")).read().strip()
    say = lambda s: print(f"kubernetes_in_image_test: {s}", flush=True)
    check_image(version, source_check=not args.skip_source_check)

    docs = render(args.overlay)
    job_docs = render("deploy/kubernetes/examples/train-job")
    config_maps = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
    sts = find(docs, "StatefulSet", "cairnd")
    ds = find(docs, "DaemonSet", "cairn-agent")
    job = find(job_docs, "Job", "train")
    token = "k8s-test-" + os.urandom(8).hex()
    secrets = {"cairn-peer-token": {"token": token}}
    # components/security: cairnd serves TLS and wants tokens; the test
    # makes the Secrets an operator (and cert-manager) would.
    secured = any("CAIRN_TLS_CERT" in data for data in config_maps.values())
    tokens = {role: f"{role}-" + os.urandom(16).hex() for role in ("agent", "writer", "admin")}

    workdir = tempfile.mkdtemp(prefix="cairn-k8s-")
    os.chmod(workdir, 0o755)
    hosts = ["cairnd.cairn.svc.cluster.local", "cairnd.cairn.svc", "cairnd.cairn", "cairnd",
             "train-0.train"]
    if secured:
        cert = next(d for d in docs if d["kind"] == "Certificate" and d["spec"]["secretName"] == "cairnd-tls")
        secrets.update(make_tls_secrets(workdir, cert["spec"]["dnsNames"]))
        secrets["cairnd-auth-tokens"] = {"tokens": (
            f"{tokens['agent']} agent * cairn-agent\n"
            f"{tokens['writer']} writer train-example train\n"
            f"{tokens['admin']} admin * ops\n")}
        secrets["cairn-agent-token"] = {"token": tokens["agent"]}
        # The ranks get the CA and a writer token, as the example's comment says.
        secrets["train-ca"] = {"ca.crt": secrets["cairnd-tls"]["ca.crt"]}
        tspec = job["spec"]["template"]["spec"]
        tspec.setdefault("volumes", []).append({"name": "cairn-ca", "secret": {"secretName": "train-ca"}})
        tc = tspec["containers"][0]
        tc.setdefault("volumeMounts", []).append(
            {"name": "cairn-ca", "mountPath": "/etc/cairn/ca", "readOnly": True})
        tc["env"] += [{"name": "CAIRN_TLS_CA", "value": "/etc/cairn/ca/ca.crt"},
                      {"name": "CAIRN_TOKEN", "value": tokens["writer"]}]
    pod = Pod(f"cairn-k8s-{os.getpid()}", workdir, hosts)
    vols = Volumes(workdir, secrets)
    # The example Job's PVC is the dev overlay's storage: one directory (the
    # local overlay mounts the same PVC itself).
    if "overlays/dev" in args.overlay:
        os.symlink(vols.host_path("/var/lib/cairn-dev/checkpoints", "DirectoryOrCreate"),
                   os.path.join(workdir, "pvc-cairn-checkpoints"))
    ok = False
    try:
        fields = {"spec.nodeName": NODE_NAME, "status.podIP": POD_IP}
        cairnd, cairnd_c, cairnd_spec, cairnd_vols = start_workload(
            pod, vols, sts, config_maps, secrets, version, fields, say)
        run_probes(pod, cairnd, cairnd_c, say)
        if secured:
            ok, out = pod.probe_grpc(7070)
            if ok:
                raise Failure("cairnd answered a plaintext health check on its TLS port 7070")
            say(f"cairnd: plaintext on the TLS port 7070 refused ({out})")
        agent, agent_c, agent_spec, _ = start_workload(
            pod, vols, ds, config_maps, secrets, version, fields, say)
        run_probes(pod, agent, agent_c, say)

        out1 = run_job(pod, vols, job, config_maps, secrets, version, say, 1)
        saved = re.findall(r"saved step (\d+)", out1)
        committed = re.findall(r"step (\d+) committed", out1)
        if not saved or not committed:
            raise Failure(f"the training job saved nothing through the agent:\n{out1}")
        say(f"job round 1: saved steps {saved}, committed {committed}")
        out2 = run_job(pod, vols, job, config_maps, secrets, version, say, 2)
        m = re.search(r"resumed from step (\d+)", out2)
        if not m or m.group(1) != committed[-1]:
            raise Failure(f"the restarted job did not resume from step {committed[-1]}:\n{out2}")
        say(f"job round 2: resumed from step {m.group(1)} (loaded through cairnd)")

        # The CLI in the image, as an operator runs it in the cairnd pod
        # (kubectl exec): offline, the pod's CAIRN_STORAGE makes it read the
        # storage; with -c it asks cairnd (the command line wins over the
        # pod's CAIRN_STORAGE), and neither warns about the daemon's CAIRN_*.
        remote = ["-c", "127.0.0.1:7070"]
        cli_env = []
        if secured:
            # Through the Service name cairnd's certificate holds, with the
            # CA and an admin token; without the token cairnd refuses.
            remote = ["-c", "cairnd.cairn.svc.cluster.local:7070"]
            cli_env = ["--env", "CAIRN_TLS_CA=/etc/cairn/tls/ca.crt"]
            refused = run(["podman", "exec", *cli_env, cairnd, "/usr/local/bin/cairn", *remote, "ls"],
                          check=False)
            if refused.returncode == 0 or "UNAUTHENTICATED" not in refused.stdout + refused.stderr:
                raise Failure(f"cairn ls without a token was not refused:\n{refused.stdout}{refused.stderr}")
            say("cairn ls through cairnd without a token: UNAUTHENTICATED")
            cli_env += ["--env", f"CAIRN_TOKEN={tokens['admin']}"]
        for how in ([], remote):
            verify = run(["podman", "exec", *(cli_env if how else []), cairnd, "/usr/local/bin/cairn", *how,
                          "verify", "train-example", "latest"], check=False)
            if verify.returncode != 0 or "warning" in verify.stderr:
                raise Failure(f"cairn {' '.join(how)} verify in the image:\n"
                              f"{verify.stdout}{verify.stderr}")
            say(f"cairn {' '.join(how + ['verify'])} train-example: ok")

        agent_log = stop_gracefully(agent, agent_spec, say)
        cairnd_log = stop_gracefully(cairnd, cairnd_spec, say)
        for text, what in ((cairnd_log, "cairnd"), (agent_log, "cairn-agent")):
            if "is set but is not a" in text:
                raise Failure(f"{what} warned about a CAIRN_* variable of its manifest:\n{text}")
        for text, what in ((cairnd_log, "cairnd"), (agent_log, "cairn-agent")):
            lines = [l for l in text.splitlines() if l.startswith("{")]
            if not lines:
                raise Failure(f"{what}: no JSON log lines though the manifest sets CAIRN_LOG_FORMAT=json:\n{text}")
            for l in lines:
                json.loads(l)
        say("both daemons logged JSON lines")
        ok = True
    finally:
        if not ok:
            for c in run(["podman", "ps", "-a", "--filter", f"pod={pod.name}", "--format", "{{.Names}}"],
                         check=False).stdout.split():
                print(f"---- logs of {c}\n{logs(c)}", file=sys.stderr)
        if not args.keep:
            pod.remove()
            for d in vols.host_paths.values():
                if d.startswith("/dev/shm/"):
                    shutil.rmtree(d, ignore_errors=True)
            shutil.rmtree(workdir, ignore_errors=True)
    say("PASS")


if __name__ == "__main__":
    try:
        main()
    except Failure as e:
        print(f"kubernetes_in_image_test: FAIL: {e}", file=sys.stderr)
        sys.exit(1)
