{{/*
The chart name, or nameOverride.
*/}}
{{- define "zps.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" }}
{{- end }}

{{/*
The prefix of every resource name. Limited to 40 characters: "<fullname>-coordinator" must stay a
63-character DNS label, and StatefulSet pod names get "-<ordinal>" plus a 10-character revision hash
in a label. A release name that contains the chart name is used as it is.
*/}}
{{- define "zps.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Chart name and version, for the helm.sh/chart label.
*/}}
{{- define "zps.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels on every object.
*/}}
{{- define "zps.labels" -}}
helm.sh/chart: {{ include "zps.chart" . }}
{{ include "zps.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: zps
{{- end }}

{{/*
Labels that select the shard pods. They never change after install (a StatefulSet's selector is
immutable), so nothing version-like belongs here.
*/}}
{{- define "zps.selectorLabels" -}}
app.kubernetes.io/name: {{ include "zps.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: shard
{{- end }}

{{/*
Names of the objects that others refer to. NOTES.txt and deploy/ use the same names.
*/}}
{{- define "zps.headlessServiceName" -}}
{{- printf "%s-headless" (include "zps.fullname" .) }}
{{- end }}

{{- define "zps.coordinatorServiceName" -}}
{{- printf "%s-coordinator" (include "zps.fullname" .) }}
{{- end }}

{{- define "zps.tokenSecretName" -}}
{{- default (printf "%s-token" (include "zps.fullname" .)) .Values.auth.existingSecret }}
{{- end }}

{{- define "zps.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "zps.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The coordinator's control-plane endpoint as workers and shards dial it: the coordinator Service's
DNS name in the release namespace, and the control port.
*/}}
{{- define "zps.coordinatorEndpoint" -}}
{{- printf "%s.%s.svc:%d" (include "zps.coordinatorServiceName" .) .Release.Namespace (int .Values.server.port) }}
{{- end }}

{{- define "zps.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/*
The server config file (--config /etc/zps/config/config.json): flat JSON whose keys are zps-server option names. --ordinal is not
here (it comes from the pod name), nor --token-file (ZPS_TOKEN_FILE in the environment, which
zps-ckpt in the preStop hook reads too).
*/}}
{{- /*
The shard count before this upgrade: reshard.previousShards, else the release's StatefulSet's
replicas (lookup), else (a new release, or no cluster to look at) the count being installed.
*/ -}}
{{- define "zps.previousShards" -}}
{{- if .Values.reshard.previousShards -}}
{{- int .Values.reshard.previousShards -}}
{{- else -}}
{{- $sts := lookup "apps/v1" "StatefulSet" .Release.Namespace (include "zps.fullname" .) -}}
{{- if and $sts $sts.spec $sts.spec.replicas -}}
{{- int $sts.spec.replicas -}}
{{- else -}}
{{- int .Values.shards -}}
{{- end -}}
{{- end -}}
{{- end }}

{{- /*
--reshard-peers: the reshard endpoint of every ordinal of the old and the new count, by the
shards' stable DNS names (a donor Job's pod takes the leaving shard's name: hostname/subdomain).
*/ -}}
{{- define "zps.reshardPeers" -}}
{{- $n := max (int (include "zps.previousShards" .)) (int .Values.shards) -}}
{{- $peers := list -}}
{{- range $i := until (int $n) -}}
{{- $peers = append $peers (printf "%s-%d.%s.%s.svc:%d" (include "zps.fullname" $) $i (include "zps.headlessServiceName" $) $.Release.Namespace (int $.Values.reshard.port)) -}}
{{- end -}}
{{- join "," $peers -}}
{{- end }}

{{- define "zps.serverConfig" -}}
{{- $cfg := dict
      "shards" (int .Values.shards)
      "coordinator" (include "zps.coordinatorEndpoint" .)
      "port" (int .Values.server.port)
      "metrics-port" (int .Values.server.metricsPort)
      "data-dir" "/var/lib/zps"
      "memory-budget" .Values.server.memoryBudget
      "checkpoint-every" (int .Values.server.checkpointEvery)
      "log-level" .Values.server.logLevel -}}
{{- if .Values.reshard.enabled }}
{{- $_ := set $cfg "reshard-peers" (include "zps.reshardPeers" .) }}
{{- $_ := set $cfg "reshard-port" (int .Values.reshard.port) }}
{{- $_ := set $cfg "reshard-timeout" (int .Values.reshard.timeoutSeconds) }}
{{- end }}
{{- range $k, $v := .Values.server.extraConfig }}
{{- if or (hasKey $cfg $k) (has $k (list "ordinal" "token-file" "config")) }}
{{- fail (printf "server.extraConfig.%s is set by the chart; use the matching value instead" $k) }}
{{- end }}
{{- $_ := set $cfg $k $v }}
{{- end }}
{{- toPrettyJson $cfg }}
{{- end }}
