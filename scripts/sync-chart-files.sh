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
# mosquitto.sites: each site's bridge login and the block deploy/mosquitto/acl documents for it (commented there).
cat >> "$chart/files/mosquitto-acl.tpl" <<'SITES'
{{ range .Values.mosquitto.sites -}}
{{ printf "\nuser %s-bridge" .id }}
topic read fl/{{ $.Values.federation }}/coordinator/status
topic read fl/{{ $.Values.federation }}/rounds/current
topic read fl/{{ $.Values.federation }}/task
topic read fl/{{ $.Values.federation }}/global/#
topic read fl/{{ $.Values.federation }}/notices/#
topic read fl/{{ $.Values.federation }}/sites/{{ .id }}/resync
topic write fl/{{ $.Values.federation }}/sites/{{ .id }}/roster
topic write fl/{{ $.Values.federation }}/sites/{{ .id }}/partials/#
{{ end -}}
SITES
echo "synced dashboards, alerts and the broker ACL into $chart/files"
