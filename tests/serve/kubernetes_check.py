"""The Kubernetes example (packaging/kubernetes) is what docs/serve.md
section 9 says: every resource valid against Kubernetes' own schemas
(kubernetes-validate, strict: no unknown field); the pod is ready on
/health of the port serve listens on, has no liveness probe on it, and its
grace period outlasts the preStop sleep plus serve's --shutdown-timeout;
the Service selects the Deployment's pods and targets that port; and
q4khost serve takes the container's command line.
Usage: kubernetes_check.py FILE Q4KHOST"""
import subprocess
import sys

import yaml

from common import CHECKS, check

DRAIN_SPARE = 3  # seconds serve takes past --shutdown-timeout to stop (streams' last events)


def option(command, name):
    """The value of --NAME=VALUE in COMMAND, or None."""
    for arg in command:
        if arg.startswith("--%s=" % name):
            return arg.split("=", 1)[1]
    return None


def main():
    path, q4khost = sys.argv[1:3]
    run = subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", path],
                         capture_output=True, text=True)
    check("kubernetes-validate --strict passes every resource", run.returncode == 0,
          run.stdout + run.stderr)
    with open(path) as f:
        docs = {d["kind"]: d for d in yaml.safe_load_all(f)}
    check("a Deployment and a Service", set(docs) == {"Deployment", "Service"}, list(docs))
    pod = docs["Deployment"]["spec"]["template"]
    (c,) = pod["spec"]["containers"]
    command = c["command"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    check("serve listens on the container's port on every address",
          option(command, "host") == "0.0.0.0" and
          int(option(command, "port")) in ports.values(), command)
    probe = c["readinessProbe"]["httpGet"]
    check("readiness is /health on that port", probe["path"] == "/health" and
          ports.get(probe["port"], probe["port"]) == int(option(command, "port")), probe)
    check("no liveness probe on /health (draining is not dead)",
          c.get("livenessProbe", {}).get("httpGet", {}).get("path") != "/health")
    pre = c["lifecycle"]["preStop"]["exec"]["command"]
    sleep = int(pre[1]) if pre[0] == "sleep" else 0
    drain = int(option(command, "shutdown-timeout"))
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    check("the grace period outlasts the preStop sleep and the drain",
          grace >= sleep + drain + DRAIN_SPARE, (grace, sleep, drain))
    svc = docs["Service"]["spec"]
    check("the Service selects the pods", all(pod["metadata"]["labels"].get(k) == v
                                              for k, v in svc["selector"].items()))
    check("the Service targets the container's port",
          all(p["targetPort"] in ports or p["targetPort"] in ports.values()
              for p in svc["ports"]))
    run = subprocess.run([q4khost, "serve"] + command[2:] + ["--help"], capture_output=True,
                         text=True)
    check("q4khost serve takes the command line", run.returncode == 0 and command[:2] ==
          ["q4khost", "serve"], run.stdout[-300:] + run.stderr)
    print("kubernetes: %d checks passed" % len(CHECKS))


if __name__ == "__main__":
    main()
