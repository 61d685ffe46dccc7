#!/usr/bin/env bash
# Copy the dashboards, alert rules and broker ACL into the Helm chart, which can only ship
# files inside its own directory. tests/unit/deploy/test_chart.py fails when they drift.
set -euo pipefail
cd "$(dirname "$0")/.."
chart=helm/edgefl-coordinator
mkdir -p "$chart/files/dashboards"
rm -f "$chart"/files/dashboards/*.json
cp dashboards/*.json "$chart/files/dashboards/"
cp dashboards/alerts.yaml "$chart/files/alerts.yaml"
# The ACL's placeholders: the coordinator's username, and the federation (fl/default/ outside comments).
sed -e 's/^user coordinator$/user {{ .Values.broker.username }}/' \
    -e '/^#/!s#fl/default/#fl/{{ .Values.federation }}/#g' deploy/mosquitto/acl > "$chart/files/mosquitto-acl.tpl"
echo "synced dashboards, alerts and the broker ACL into $chart/files"
