#!/usr/bin/env bash
# Checks deploy/: the Prometheus config and alert rules (promtool check), the alerts' unit tests
# (promtool test rules deploy/prometheus/alerts_test.yml), the Grafana dashboard and the
# provisioning files, and docker-compose.yml parse and agree with each other.
#
#   deploy/check.sh
#
# promtool is used from PATH, else from target/tools/; when missing there it is taken from
# Debian's `prometheus` package: only the promtool binary (48 MB, static) is extracted from the
# .deb, instead of installing the package (96 MB with the server and its web assets, a system
# service started by its postinst, and JavaScript dependencies).
set -euo pipefail
cd "$(dirname "$0")/.."

promtool=$(command -v promtool || true)
if [ -z "$promtool" ]; then
  promtool=target/tools/promtool
  if [ ! -x "$promtool" ]; then
    if ! command -v apt-get >/dev/null || ! command -v dpkg-deb >/dev/null; then
      echo "promtool is missing: install Prometheus (Debian: apt-get install prometheus; macOS: brew install prometheus)." >&2
      exit 1
    fi
    echo "installing promtool from Debian's prometheus package into target/tools/"
    download=$(mktemp -d)
    trap 'rm -rf "$download"' EXIT
    # apt's download user must be able to write there.
    chmod 777 "$download"
    if ! (cd "$download" && apt-get download -q prometheus >/dev/null 2>&1); then
      apt-get update -q >/dev/null
      (cd "$download" && apt-get download -q prometheus >/dev/null)
    fi
    dpkg-deb --fsys-tarfile "$download"/prometheus_*.deb | tar -x -C "$download" ./usr/bin/promtool
    mkdir -p target/tools
    mv "$download/usr/bin/promtool" "$promtool"
  fi
fi
promtool=$(realpath "$promtool")
"$promtool" --version | head -1

"$promtool" check config deploy/prometheus/prometheus.yml
"$promtool" check rules deploy/prometheus/alerts.yml
(cd deploy/prometheus && "$promtool" test rules alerts_test.yml)

# Every alert has a unit test, the dashboard is JSON on the provisioned datasource, and the
# compose file mounts what the provisioning expects.
python3 - <<'PY'
import json, re, sys
alerts = set(re.findall(r"^\s*- alert: (\w+)", open("deploy/prometheus/alerts.yml").read(), re.M))
tested = set(re.findall(r"alertname: (\w+)", open("deploy/prometheus/alerts_test.yml").read()))
untested = sorted(alerts - tested)
if untested:
    sys.exit(f"alerts without a unit test in alerts_test.yml: {untested}")
dashboard = json.load(open("deploy/grafana/orderpay.json"))
datasource = re.search(r"uid: (\S+)", open("deploy/grafana/provisioning/datasources/prometheus.yml").read()).group(1)
panels = [p for p in dashboard["panels"] if p["type"] != "row"]
wrong = [p["title"] for p in panels if p["datasource"]["uid"] != datasource or not p.get("targets")]
if wrong:
    sys.exit(f"dashboard panels without a query on datasource {datasource}: {wrong}")
try:
    import yaml
except ImportError:
    print("python3-yaml missing: YAML of docker-compose.yml and the provisioning not parsed")
else:
    for path in ["docker-compose.yml", "deploy/grafana/provisioning/datasources/prometheus.yml",
                 "deploy/grafana/provisioning/dashboards/orderpay.yml"]:
        yaml.safe_load(open(path))
    services = yaml.safe_load(open("docker-compose.yml"))["services"]
    for name in ["prometheus", "grafana"]:
        if services[name].get("profiles") != ["monitoring"]:
            sys.exit(f"docker-compose.yml: {name} is not under the monitoring profile")
print(f"{len(alerts)} alerts, each unit-tested; dashboard: {len(panels)} panels on {datasource}")
PY
