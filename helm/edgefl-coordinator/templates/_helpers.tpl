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

{{/*
Every pod's imagePullSecrets: global.imagePullSecrets (a parent chart's) and imagePullSecrets,
each Secret once; empty when there are none.
*/}}
{{- define "edgefl.imagePullSecrets" -}}
{{- $global := ((.Values.global | default dict).imagePullSecrets | default list) -}}
{{- $secrets := concat $global (.Values.imagePullSecrets | default list) | uniq -}}
{{- with $secrets }}{{ toYaml . }}{{ end -}}
{{- end -}}

{{- define "edgefl.mosquittoName" -}}
{{- printf "%s-mosquitto" (include "edgefl.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The broker the coordinator connects to: the bundled one (over TLS when it has TLS), or broker.url. */}}
{{- define "edgefl.brokerUrl" -}}
{{- if and .Values.mosquitto.enabled .Values.mosquitto.tls.enabled -}}
{{- printf "mqtts://%s:%d" (include "edgefl.mosquittoName" .) (int .Values.mosquitto.tls.port) -}}
{{- else if .Values.mosquitto.enabled -}}
{{- printf "mqtt://%s:%d" (include "edgefl.mosquittoName" .) (int .Values.mosquitto.port) -}}
{{- else if .Values.broker.url -}}
{{- .Values.broker.url -}}
{{- else -}}
{{- fail "broker.url is required when mosquitto.enabled is false (e.g. mqtt://broker.example:1883)" -}}
{{- end -}}
{{- end -}}

{{/* The TCP port of the broker URL: its explicit port, else 8883 for mqtts/ssl and 1883 for mqtt/tcp. */}}
{{- define "edgefl.brokerPort" -}}
{{- $url := urlParse (include "edgefl.brokerUrl" .) -}}
{{- $port := regexFind "[0-9]+$" (regexFind ":[0-9]+$" $url.host) -}}
{{- if $port -}}{{ $port }}{{- else if has $url.scheme (list "mqtts" "ssl") -}}8883{{- else -}}1883{{- end -}}
{{- end -}}

{{/* "true" when the bundled broker opens its plaintext listener: always without TLS, with TLS only if asked. */}}
{{- define "edgefl.mosquittoPlaintext" -}}
{{- if or (not .Values.mosquitto.tls.enabled) .Values.mosquitto.plaintextListener -}}true{{- end -}}
{{- end -}}

{{/*
The coordinator's TLS files: the Secret and key of the CA that signed the broker's certificate
(broker.tls.caSecret, else the bundled broker's own TLS Secret's ca.crt), and the Secret of its
client certificate. Empty values: none.
*/}}
{{- define "edgefl.coordinatorTls" -}}
{{- $t := .Values.broker.tls -}}
{{- $bundledTls := and .Values.mosquitto.enabled .Values.mosquitto.tls.enabled -}}
caSecret: {{ ternary .Values.mosquitto.tls.existingSecret $t.caSecret (and $bundledTls (not $t.caSecret)) | quote }}
caKey: {{ ternary "ca.crt" $t.caKey (and $bundledTls (not $t.caSecret)) | quote }}
certSecret: {{ $t.clientCertSecret | quote }}
{{- end -}}

{{/* The coordinator's ca_file, cert_file and key_file settings (where the Secrets are mounted). */}}
{{- define "edgefl.coordinatorTlsSettings" -}}
{{- $tls := include "edgefl.coordinatorTls" . | fromYaml -}}
{{- if $tls.caSecret }}
ca_file: /etc/edgefl-tls/ca/ca.crt
{{- end }}
{{- if $tls.certSecret }}
cert_file: /etc/edgefl-tls/client/tls.crt
key_file: /etc/edgefl-tls/client/tls.key
{{- end }}
{{- end -}}

{{/*
"true" when the bundled broker checks the coordinator's password: not when every listener takes
a client certificate as the identity (mosquitto.tls.requireClientCertificate without a
plaintext listener), where the coordinator presents broker.tls.clientCertSecret instead.
*/}}
{{- define "edgefl.bundledBrokerNeedsPassword" -}}
{{- $m := .Values.mosquitto -}}
{{- if and $m.enabled (or (not ($m.tls.enabled)) (not $m.tls.requireClientCertificate) (include "edgefl.mosquittoPlaintext" .)) -}}true{{- end -}}
{{- end -}}

{{/* "true" when the chart keeps the coordinator's password in a Secret of its own (<fullname>-broker). */}}
{{- define "edgefl.chartBrokerSecret" -}}
{{- if and (not .Values.broker.existingSecret.name) (or .Values.broker.password (include "edgefl.bundledBrokerNeedsPassword" .)) -}}true{{- end -}}
{{- end -}}

{{/* The Secret holding the coordinator's broker password, if there is one. */}}
{{- define "edgefl.brokerSecretName" -}}
{{- if .Values.broker.existingSecret.name -}}
{{- .Values.broker.existingSecret.name -}}
{{- else if include "edgefl.chartBrokerSecret" . -}}
{{- printf "%s-broker" (include "edgefl.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "edgefl.brokerPasswordKey" -}}
{{- if .Values.broker.existingSecret.name -}}{{ .Values.broker.existingSecret.passwordKey }}{{- else -}}password{{- end -}}
{{- end -}}

{{/*
The password the chart stores: the given one, else the one already installed (so upgrades
keep it). Nothing is generated: a random one would differ on every `helm template` (GitOps
tools render that way, and lookup finds nothing there), changing the Secret and restarting
both pods on each sync. A first install therefore names it, or names a Secret.
*/}}
{{- define "edgefl.brokerPassword" -}}
{{- $name := printf "%s-broker" (include "edgefl.fullname" .) -}}
{{- if .Values.broker.password -}}
{{- .Values.broker.password -}}
{{- else -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace $name -}}
{{- if and $existing $existing.data (hasKey $existing.data "password") -}}
{{- index $existing.data "password" | b64dec -}}
{{- else -}}
{{- /* A wrong combination of values is the better message, whichever template renders first. */ -}}
{{- include "edgefl.validate" . -}}
{{- fail (printf "broker.password is required: the bundled broker needs the coordinator's password, and Secret %s (kept from an earlier install) was not found, as on a first install or under helm template/GitOps. Set broker.password (e.g. --set broker.password=$(openssl rand -hex 24)) or broker.existingSecret.name" $name) -}}
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

{{/*
The limits the coordinator runs with: fleet.maxUpdateBytes and fleet.maxMessageBytes, unless
coordinator.config sets max_update_bytes or max_message_bytes itself. The bundled broker is
sized from the same numbers, so the two never disagree.
*/}}
{{- define "edgefl.messageLimits" -}}
{{- $c := .Values.coordinator.config -}}
{{- $f := .Values.fleet -}}
max_update_bytes: {{ int64 (ternary $c.max_update_bytes $f.maxUpdateBytes (hasKey $c "max_update_bytes")) }}
max_message_bytes: {{ int64 (ternary $c.max_message_bytes $f.maxMessageBytes (hasKey $c "max_message_bytes")) }}
{{- end -}}

{{/*
The bundled broker's queue, window, packet and memory sizes, derived from the fleet
(docs/broker-sizing.md explains each formula). A mosquitto.* value or a memory in
mosquitto.resources that is set (not null) replaces the derived one.
*/}}
{{- define "edgefl.brokerSizing" -}}
{{- $f := .Values.fleet -}}
{{- $m := .Values.mosquitto -}}
{{- $c := .Values.coordinator.config -}}
{{- $limits := include "edgefl.messageLimits" . | fromYaml -}}
{{- $agents := int64 $f.maxAgents -}}
{{- $update := int64 $limits.max_update_bytes -}}
{{- $chunk := int64 $limits.max_message_bytes -}}
{{- $statusBytes := 2048 -}}
{{- $chunkOverhead := 320 -}}
{{- /* Pieces of one update, and the size of the largest piece (chunks carry up to 320 bytes of envelope and signature: CHUNK_OVERHEAD_BYTES). */ -}}
{{- $pieces := 1 -}}
{{- $piece := $update -}}
{{- if and (gt $chunk 0) (gt $update $chunk) -}}
{{- $data := sub $chunk $chunkOverhead -}}
{{- $pieces = div (sub (add $update $data) 1) $data -}}
{{- $piece = $chunk -}}
{{- end -}}
{{- /* Largest message on the broker: a chunk when chunking, else a whole update (or global state). */ -}}
{{- $largest := ternary $chunk $update (gt $chunk 0) -}}
{{- /* Status messages per agent per round: a heartbeat every heartbeatSeconds through the round, plus two changes. */ -}}
{{- $statuses := 0 -}}
{{- if kindIs "invalid" $f.statusesPerRound -}}
{{- $deadline := ternary $c.round_deadline_s 60 (hasKey $c "round_deadline_s") -}}
{{- $statuses = add (int64 (ceil (divf $deadline $f.heartbeatSeconds))) 2 -}}
{{- else -}}
{{- $statuses = int64 $f.statusesPerRound -}}
{{- end -}}
{{- $scale := add 100 (int64 $f.headroomPercent) -}}
{{- $roundMessages := mul $agents (add $pieces $statuses) -}}
{{- $roundBytes := mul $agents (add (mul $pieces $piece) (mul $statuses $statusBytes)) -}}
{{- $derivedQueuedMessages := div (add (mul $roundMessages $scale) 99) 100 -}}
{{- $derivedQueuedBytes := div (add (mul $roundBytes $scale) 99) 100 -}}
{{- $derivedInflight := max 20 (min $agents 100) -}}
{{- $derivedPacket := min 268435455 (add $largest (div $largest 4) 65536) -}}
{{- /* Site bridges carry rosters of up to 1,000 statuses, which the coordinator takes up to 8,802,304 bytes
(coordinator/admission/intake.py roster_limits): a smaller packet limit cuts the bridge at a site's first roster. */ -}}
{{- if $m.sites -}}
{{- $derivedPacket = max $derivedPacket (add 8802304 65536) -}}
{{- end -}}
{{- $queuedMessages := ternary $derivedQueuedMessages $m.maxQueuedMessages (kindIs "invalid" $m.maxQueuedMessages) | int64 -}}
{{- $queuedBytes := ternary $derivedQueuedBytes $m.maxQueuedBytes (kindIs "invalid" $m.maxQueuedBytes) | int64 -}}
{{- $inflight := ternary $derivedInflight $m.maxInflightMessages (kindIs "invalid" $m.maxInflightMessages) | int64 -}}
{{- $packet := ternary $derivedPacket $m.maxPacketSize (kindIs "invalid" $m.maxPacketSize) | int64 -}}
{{- /* Memory: a base, per-connection buffers, every queued byte, and a full window of the largest pieces. */ -}}
{{- $memQueued := ternary $queuedBytes $derivedQueuedBytes (gt $queuedBytes 0) -}}
{{- $memInflight := ternary $inflight $derivedInflight (gt $inflight 0) -}}
{{- $memory := add (mul 64 1048576) (mul $agents 65536) $memQueued (mul $memInflight $piece) -}}
{{- $memoryMi := div (add $memory 1048575) 1048576 -}}
piecesPerUpdate: {{ $pieces }}
statusesPerRound: {{ $statuses }}
largestMessageBytes: {{ $largest }}
maxQueuedMessages: {{ $queuedMessages }}
maxQueuedBytes: {{ $queuedBytes }}
maxInflightMessages: {{ $inflight }}
maxPacketSize: {{ $packet }}
memory: {{ printf "%dMi" $memoryMi | quote }}
{{- end -}}

{{/* The broker container's resources: mosquitto.resources, with the derived memory where it sets none. */}}
{{- define "edgefl.mosquittoResources" -}}
{{- $sizing := include "edgefl.brokerSizing" . | fromYaml -}}
{{- $r := deepCopy (default (dict) .Values.mosquitto.resources) -}}
{{- $requests := default (dict) $r.requests -}}
{{- $limits := default (dict) $r.limits -}}
{{- /* One of the two set: the other follows it (a request over the limit is invalid). */ -}}
{{- $memory := $requests.memory | default $limits.memory | default $sizing.memory -}}
{{- if not $requests.memory -}}{{- $_ := set $requests "memory" ($limits.memory | default $memory) -}}{{- end -}}
{{- if not $limits.memory -}}{{- $_ := set $limits "memory" $memory -}}{{- end -}}
{{- $_ := set $r "requests" $requests -}}
{{- $_ := set $r "limits" $limits -}}
{{- toYaml $r -}}
{{- end -}}

{{/* Checks of combinations the schema cannot express. */}}
{{- define "edgefl.validate" -}}
{{- $managed := list "federation" "broker_url" "broker_username" "broker_password" "ca_file" "cert_file" "key_file" "state_dir" "http_host" "http_port" -}}
{{- range $key := $managed -}}
{{- if hasKey $.Values.coordinator.config $key -}}
{{- fail (printf "coordinator.config.%s is set by the chart; use the top-level values (federation, broker.*, broker.tls.*, persistence, coordinator.httpPort) instead" $key) -}}
{{- end -}}
{{- end -}}
{{- $c := .Values.coordinator -}}
{{- range $c.extraVolumes -}}
{{- if has .name (list "config" "state" "tmp" "broker-ca" "client-tls") -}}
{{- fail (printf "coordinator.extraVolumes: the name %q is the chart's own volume; choose another" .name) -}}
{{- end -}}
{{- end -}}
{{- $volumes := list "config" "state" "tmp" -}}
{{- range $c.extraVolumes -}}{{- $volumes = append $volumes .name -}}{{- end -}}
{{- range $c.extraVolumeMounts -}}
{{- if not (has .name $volumes) -}}
{{- fail (printf "coordinator.extraVolumeMounts: %q names no volume; add it to coordinator.extraVolumes" .name) -}}
{{- end -}}
{{- if has (trimSuffix "/" .mountPath) (list "/etc/edgefl" "/var/lib/edgefl" "/tmp" "/etc/edgefl-tls/ca" "/etc/edgefl-tls/client") -}}
{{- fail (printf "coordinator.extraVolumeMounts: %s is where the chart mounts its own volume; mount %q elsewhere" .mountPath .name) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.mosquitto.enabled .Values.broker.existingSecret.usernameKey -}}
{{- fail "broker.existingSecret.usernameKey cannot be used with the bundled broker: its ACL needs broker.username at install time" -}}
{{- end -}}
{{- if and .Values.mosquitto.enabled .Values.mosquitto.tls.enabled (not .Values.mosquitto.tls.existingSecret) -}}
{{- fail "mosquitto.tls.enabled needs mosquitto.tls.existingSecret (a kubernetes.io/tls Secret)" -}}
{{- end -}}
{{- $m := .Values.mosquitto -}}
{{- if and $m.enabled $m.tls.requireClientCertificate -}}
{{- if not $m.tls.enabled -}}
{{- fail "mosquitto.tls.requireClientCertificate needs mosquitto.tls.enabled: certificates are presented over TLS" -}}
{{- end -}}
{{- if not $m.tls.clientCASecret -}}
{{- fail "mosquitto.tls.requireClientCertificate needs mosquitto.tls.clientCASecret: the CA client certificates must chain to" -}}
{{- end -}}
{{- if not .Values.broker.tls.clientCertSecret -}}
{{- fail "mosquitto.tls.requireClientCertificate needs broker.tls.clientCertSecret: the coordinator's own client certificate (CN = broker.username)" -}}
{{- end -}}
{{- end -}}
{{- $tls := include "edgefl.coordinatorTls" . | fromYaml -}}
{{- if and (or $tls.caSecret $tls.certSecret) (not (hasPrefix "mqtts://" (include "edgefl.brokerUrl" .))) (not (hasPrefix "ssl://" (include "edgefl.brokerUrl" .))) -}}
{{- fail "broker.tls.caSecret and broker.tls.clientCertSecret are only used over TLS: the broker URL must start with mqtts:// (or enable mosquitto.tls)" -}}
{{- end -}}
{{- /* A device account named like the coordinator's or a bridge's would log in with that account's ACL grants. */ -}}
{{- $privileged := list .Values.broker.username -}}
{{- range $m.sites -}}{{- $privileged = append $privileged (printf "%s-bridge" .id) -}}{{- end -}}
{{- $seen := list -}}
{{- range $m.agents -}}
{{- if has .username $privileged -}}
{{- fail (printf "mosquitto.agents: %q is the coordinator's or a site bridge's broker username; a device logging in with it would get that account's ACL grants" .username) -}}
{{- end -}}
{{- if has .username $seen -}}
{{- fail (printf "mosquitto.agents: %q is listed twice" .username) -}}
{{- end -}}
{{- $seen = append $seen .username -}}
{{- end -}}
{{- if .Values.mosquitto.enabled -}}
{{- $limits := include "edgefl.messageLimits" . | fromYaml -}}
{{- if and (eq (int64 $limits.max_message_bytes) 0) (gt (int64 $limits.max_update_bytes) 268369920) -}}
{{- fail "fleet.maxUpdateBytes is over what one MQTT message can carry (256 MiB less 64 KiB): set fleet.maxMessageBytes to split updates into chunks" -}}
{{- end -}}
{{- end -}}
{{- end -}}
