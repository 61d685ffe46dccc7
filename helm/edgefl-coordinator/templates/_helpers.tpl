{{/* Names, labels and the pieces several templates share. */}}

{{- define "edgefl.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: release-chart, unless the release name already contains the chart name. */}}
{{- define "edgefl.fullname" -}}
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

{{- define "edgefl.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "edgefl.labels" -}}
helm.sh/chart: {{ include "edgefl.chart" . }}
{{ include "edgefl.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: edgefl
{{- end -}}

{{- define "edgefl.selectorLabels" -}}
app.kubernetes.io/name: {{ include "edgefl.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of one component: coordinator, mosquitto, dashboards, test. */}}
{{- define "edgefl.componentLabels" -}}
{{ include "edgefl.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "edgefl.componentSelectorLabels" -}}
{{ include "edgefl.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "edgefl.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "edgefl.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "edgefl.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "edgefl.mosquittoName" -}}
{{- printf "%s-mosquitto" (include "edgefl.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The broker the coordinator connects to: the bundled one, or broker.url. */}}
{{- define "edgefl.brokerUrl" -}}
{{- if .Values.mosquitto.enabled -}}
{{- printf "mqtt://%s:%d" (include "edgefl.mosquittoName" .) (int .Values.mosquitto.port) -}}
{{- else if .Values.broker.url -}}
{{- .Values.broker.url -}}
{{- else -}}
{{- fail "broker.url is required when mosquitto.enabled is false (e.g. mqtt://broker.example:1883)" -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding the coordinator's broker password, if there is one. */}}
{{- define "edgefl.brokerSecretName" -}}
{{- if .Values.broker.existingSecret.name -}}
{{- .Values.broker.existingSecret.name -}}
{{- else if or .Values.broker.password .Values.mosquitto.enabled -}}
{{- printf "%s-broker" (include "edgefl.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "edgefl.brokerPasswordKey" -}}
{{- if .Values.broker.existingSecret.name -}}{{ .Values.broker.existingSecret.passwordKey }}{{- else -}}password{{- end -}}
{{- end -}}

{{/*
The password the chart stores: the given one, else the one already installed (so upgrades
keep it), else a new random one. Offline rendering (helm template) has no installed one.
*/}}
{{- define "edgefl.brokerPassword" -}}
{{- if .Values.broker.password -}}
{{- .Values.broker.password -}}
{{- else -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (printf "%s-broker" (include "edgefl.fullname" .)) -}}
{{- if and $existing $existing.data (hasKey $existing.data "password") -}}
{{- index $existing.data "password" | b64dec -}}
{{- else -}}
{{- randAlphaNum 32 -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Environment variables with the coordinator's broker credentials, named by `prefix`
(FL_COORDINATOR_BROKER_ for the coordinator; the broker's init container uses its own).
*/}}
{{- define "edgefl.brokerCredentialsEnv" -}}
{{- $root := .root -}}
{{- $secret := include "edgefl.brokerSecretName" $root -}}
{{- $existing := $root.Values.broker.existingSecret -}}
{{- if and $existing.name $existing.usernameKey }}
- name: {{ .prefix }}USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ $existing.name }}
      key: {{ $existing.usernameKey }}
{{- else if $root.Values.broker.username }}
- name: {{ .prefix }}USERNAME
  value: {{ $root.Values.broker.username | quote }}
{{- end }}
{{- if $secret }}
- name: {{ .prefix }}PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ include "edgefl.brokerPasswordKey" $root }}
{{- end }}
{{- end -}}

{{/* Checks of combinations the schema cannot express. */}}
{{- define "edgefl.validate" -}}
{{- $managed := list "federation" "broker_url" "broker_username" "broker_password" "state_dir" "http_host" "http_port" -}}
{{- range $key := $managed -}}
{{- if hasKey $.Values.coordinator.config $key -}}
{{- fail (printf "coordinator.config.%s is set by the chart; use the top-level values (federation, broker.*, persistence, coordinator.httpPort) instead" $key) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.mosquitto.enabled .Values.broker.existingSecret.usernameKey -}}
{{- fail "broker.existingSecret.usernameKey cannot be used with the bundled broker: its ACL needs broker.username at install time" -}}
{{- end -}}
{{- if and .Values.mosquitto.enabled .Values.mosquitto.tls.enabled (not .Values.mosquitto.tls.existingSecret) -}}
{{- fail "mosquitto.tls.enabled needs mosquitto.tls.existingSecret (a kubernetes.io/tls Secret)" -}}
{{- end -}}
{{- end -}}
