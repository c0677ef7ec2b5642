#!/usr/bin/env python3
"""Checks the structure of docker/compose.yml as `docker compose config --format json` renders it
for one profile (read from stdin; the profile is the first argument):

- some services join the network alias `replicas` (what nginx and Prometheus look up), and each
  exposes port 8000; in the gpu profile each reserves a GPU device;
- the load balancer, Prometheus and Grafana are in the profile;
- every bind mount's source exists, so the stack mounts files that are in the repository
  (models/ excepted: `make model` fetches it).

Run by scripts/check-deploy-files.sh.
"""

import json
import os
import sys


def problems(config: dict, profile: str) -> list[str]:
    found = []
    services = config.get("services", {})
    replicas = [
        name
        for name, service in services.items()
        if "replicas" in (((service.get("networks") or {}).get("default") or {}).get("aliases") or [])
    ]
    if not replicas:
        found.append("no service joins the network alias `replicas`")
    for name in ("lb", "prometheus", "grafana"):
        if name not in services:
            found.append(f"service {name} is not in profile {profile}")
    for name in replicas:
        service = services[name]
        if "8000" not in [str(port) for port in service.get("expose", [])]:
            found.append(f"replica {name} does not expose 8000")
        if profile == "gpu":
            reservations = service.get("deploy", {}).get("resources", {}).get("reservations", {})
            if not any("gpu" in device.get("capabilities", []) for device in reservations.get("devices", [])):
                found.append(f"GPU replica {name} reserves no GPU device")
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.get("source", "")
            if volume.get("type") == "bind" and not source.endswith("/models") and not os.path.exists(source):
                found.append(f"{name}: bind mount source {source} does not exist")
    return found


def main() -> None:
    profile = sys.argv[1]
    config = json.load(sys.stdin)
    found = problems(config, profile)
    if found:
        sys.exit("docker/compose.yml, profile " + profile + ":\n  " + "\n  ".join(found))
    replicas = sorted(n for n in config["services"] if n.startswith("pagoda"))
    print(f"profile {profile}: services {sorted(config['services'])}, replicas {replicas}", file=sys.stderr)


if __name__ == "__main__":
    main()
