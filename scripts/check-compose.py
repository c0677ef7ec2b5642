#!/usr/bin/env python3
"""Checks the structure of docker/compose.yml as `docker compose config --format json` renders it
for one profile (read from stdin; the profile is the first argument):

- some services join the network alias `replicas` (what nginx, the router and Prometheus look
  up), and each exposes port 8000 and serves /get_load in vllm-router's shape; in the gpu profile
  each reserves a GPU device;
- the load balancer, the router, Prometheus and Grafana are in the profile;
- the router runs vllm-router's cache_aware policy, waits for every replica to be healthy (it
  looks them up once, when it starts) and publishes a host port of its own, not nginx's;
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
    for name in ("lb", "router", "prometheus", "grafana"):
        if name not in services:
            found.append(f"service {name} is not in profile {profile}")
    for name in replicas:
        service = services[name]
        if "8000" not in [str(port) for port in service.get("expose", [])]:
            found.append(f"replica {name} does not expose 8000")
        if not has_flag(service.get("command") or [], "--get-load-format", "vllm-router"):
            found.append(f"replica {name} does not serve /get_load for vllm-router (--get-load-format)")
        if profile == "gpu":
            reservations = service.get("deploy", {}).get("resources", {}).get("reservations", {})
            if not any("gpu" in device.get("capabilities", []) for device in reservations.get("devices", [])):
                found.append(f"GPU replica {name} reserves no GPU device")
    if "router" in services:
        found.extend(router_problems(services, replicas))
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.get("source", "")
            if volume.get("type") == "bind" and not source.endswith("/models") and not os.path.exists(source):
                found.append(f"{name}: bind mount source {source} does not exist")
    return found


def has_flag(command: list, flag: str, value: str) -> bool:
    """Whether `command` passes `flag value` (as two arguments or as `flag=value`)."""
    args = [str(a) for a in command]
    return f"{flag}={value}" in args or any(a == flag and b == value for a, b in zip(args, args[1:]))


def router_problems(services: dict, replicas: list[str]) -> list[str]:
    router = services["router"]
    found = []
    if not has_flag(router.get("command") or [], "--policy", "cache_aware"):
        found.append("router: its command does not pass --policy cache_aware")
    depends = router.get("depends_on") or {}
    for name in replicas:
        if (depends.get(name) or {}).get("condition") != "service_healthy":
            found.append(f"router: does not wait for replica {name} to be healthy (depends_on)")

    def published(name: str) -> set[str]:
        return {str(p.get("published")) for p in services.get(name, {}).get("ports", [])}

    if not published("router"):
        found.append("router: publishes no host port")
    elif published("router") & published("lb"):
        found.append(f"router: host port {sorted(published('router') & published('lb'))} is also nginx's")
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
