{{/* Names, labels and the pieces several templates share. */}}

{{- define "site.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "site.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "site.mosquittoName" -}}
{{- printf "%s-mosquitto" (include "site.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "site.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "site.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: edgefl
edgefl.io/site: {{ .Values.siteId | quote }}
{{- end -}}

{{- define "site.selectorLabels" -}}
app.kubernetes.io/name: {{ include "site.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of one component: aggregator or mosquitto. */}}
{{- define "site.componentLabels" -}}
{{ include "site.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "site.componentSelectorLabels" -}}
{{ include "site.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "site.imagePullSecrets" -}}
{{- range .Values.imagePullSecrets }}
- name: {{ .name }}
{{- end }}
{{- end -}}

{{/* The bridge's username at the root broker. */}}
{{- define "site.bridgeUsername" -}}
{{- default (printf "%s-bridge" .Values.siteId) .Values.root.username -}}
{{- end -}}

{{/* Secret and key of a password: the user's existingSecret, or the chart's own Secret. */}}
{{- define "site.passwordRef" -}}
{{- if .existing.name -}}
name: {{ .existing.name }}
key: {{ .existing.passwordKey }}
{{- else -}}
name: {{ .own }}
key: password
{{- end -}}
{{- end -}}

{{- define "site.credentialsSecret" -}}
{{- default (printf "%s-credentials" (include "site.fullname" .)) .Values.aggregator.credentials.existingSecret -}}
{{- end -}}

{{/* The bridge's topic lines: the same as deploy/mosquitto/site-bridge.conf and launcher/sites.py. */}}
{{- define "site.bridgeTopics" -}}
{{- $f := .Values.federation -}}
# Down: what agents and the site aggregator follow (retained messages are retained here too).
topic fl/{{ $f }}/coordinator/status in 1
topic fl/{{ $f }}/rounds/current in 1
topic fl/{{ $f }}/task in 1
topic fl/{{ $f }}/global/# in 1
topic fl/{{ $f }}/notices/# in 1
topic fl/{{ $f }}/sites/+/resync in 1
# Up: the site's roster of its agents (the root selects agents by it) and its partial aggregates.
# Agents' statuses and updates (fl/{{ $f }}/agents/..., fl/{{ $f }}/updates/...) are not bridged: they stay at the site.
topic fl/{{ $f }}/sites/+/roster out 1
topic fl/{{ $f }}/sites/+/partials/# out 1
{{- end -}}
