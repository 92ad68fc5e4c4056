{{/*
Names and labels. Every helper here takes a root-shaped context (.Values,
.Release, .Chart): `.` inside this chart, `.Subcharts.<name or alias>` from a
parent chart - so an injected sidecar gets the same names as the objects this
chart renders for it.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "guardrail-sidecar.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name: fullnameOverride, else <release>-<name>, else the release name
when it already contains the name. Truncated to 63 characters (DNS labels).
*/}}
{{- define "guardrail-sidecar.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* name-version, for the helm.sh/chart label. */}}
{{- define "guardrail-sidecar.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Common labels. */}}
{{- define "guardrail-sidecar.labels" -}}
helm.sh/chart: {{ include "guardrail-sidecar.chart" . }}
{{ include "guardrail-sidecar.selectorLabels" . }}
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
app.kubernetes.io/component: guardrail
app.kubernetes.io/part-of: rag-guardrail
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels: immutable on a Deployment, so never add to them. */}}
{{- define "guardrail-sidecar.selectorLabels" -}}
app.kubernetes.io/name: {{ include "guardrail-sidecar.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
The PromQL label matchers (no braces) of this release's series in the alerts:
prometheusRule.selector, else the namespace and the job the chart's ServiceMonitor
(the Service's name) or PodMonitor (<namespace>/<PodMonitor name>) gives them.
*/}}
{{- define "guardrail-sidecar.alertSelector" -}}
{{- if .Values.prometheusRule.selector }}
{{- .Values.prometheusRule.selector }}
{{- else }}
{{- $full := include "guardrail-sidecar.fullname" . }}
{{- printf "namespace=%q,job=~%q" .Release.Namespace (printf "%s|%s/%s" $full .Release.Namespace $full) }}
{{- end }}
{{- end }}

{{/* An alert's labels: (list .Values.prometheusRule <the alert's values>). */}}
{{- define "guardrail-sidecar.alertLabels" -}}
{{- $r := index . 0 }}
{{- $alert := index . 1 }}
{{- with $r.alertLabels }}
{{- toYaml (omit . "severity") }}
{{ end }}
{{- printf "severity: %s" ($alert.severity | quote) }}
{{- end }}

{{/* The ServiceAccount of the standalone Deployment. */}}
{{- define "guardrail-sidecar.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "guardrail-sidecar.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The image reference: repository@digest, or repository:tag where the tag
defaults to the appVersion and the GPU variant uses gpuTag or "<tag>-gpu".
*/}}
{{- define "guardrail-sidecar.image" -}}
{{- $img := .Values.image }}
{{- if $img.digest }}
{{- printf "%s@%s" $img.repository $img.digest }}
{{- else }}
{{- $tag := default .Chart.AppVersion $img.tag | toString }}
{{- if eq $img.variant "gpu" }}
{{- $tag = default (printf "%s-gpu" $tag) $img.gpuTag }}
{{- end }}
{{- printf "%s:%s" $img.repository $tag }}
{{- end }}
{{- end }}

{{/* The ConfigMap holding the policy, or "" when there is none. */}}
{{- define "guardrail-sidecar.policyConfigMap" -}}
{{- if .Values.policy.existingConfigMap }}
{{- .Values.policy.existingConfigMap }}
{{- else if .Values.policy.inline }}
{{- printf "%s-policy" (include "guardrail-sidecar.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/*
Render-time checks that JSON Schema cannot express. Included by every
template that renders a workload, so a bad combination fails `helm template`.
*/}}
{{- define "guardrail-sidecar.validate" -}}
{{- $v := .Values }}
{{- if hasPrefix "SASL" $v.kafka.securityProtocol }}
{{- if or (not $v.kafka.sasl.mechanism) (not $v.kafka.sasl.existingSecret) }}
{{- fail (printf "kafka.securityProtocol=%s needs kafka.sasl.mechanism (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512) and kafka.sasl.existingSecret (a Secret with the keys %s and %s)" $v.kafka.securityProtocol $v.kafka.sasl.usernameKey $v.kafka.sasl.passwordKey) }}
{{- end }}
{{- end }}
{{- if and (or $v.kafka.ssl.caSecret $v.kafka.ssl.clientCertSecret) (not (has $v.kafka.securityProtocol (list "SSL" "SASL_SSL"))) }}
{{- fail (printf "kafka.ssl.* is set but kafka.securityProtocol=%s does not use TLS; use SSL or SASL_SSL" $v.kafka.securityProtocol) }}
{{- end }}
{{- if $v.judge.apiKeySecret }}
{{- range $v.extraEnv }}
{{- if eq .name "GUARDRAIL_JUDGE__API_KEY" }}
{{- fail "judge.apiKeySecret is set and extraEnv holds GUARDRAIL_JUDGE__API_KEY: the sidecar takes the judge's key one way; remove GUARDRAIL_JUDGE__API_KEY from extraEnv (the mounted file is read again when the Secret changes), or unset judge.apiKeySecret" }}
{{- end }}
{{- end }}
{{- end }}
{{- if and $v.kafka.sasl.passwordAsFile (not (hasPrefix "SASL" $v.kafka.securityProtocol)) }}
{{- fail (printf "kafka.sasl.passwordAsFile is set but kafka.securityProtocol=%s does not use SASL; use SASL_SSL or SASL_PLAINTEXT, or unset it" $v.kafka.securityProtocol) }}
{{- end }}
{{- if and $v.kafka.sasl.usernameAsFile (not (hasPrefix "SASL" $v.kafka.securityProtocol)) }}
{{- fail (printf "kafka.sasl.usernameAsFile is set but kafka.securityProtocol=%s does not use SASL; use SASL_SSL or SASL_PLAINTEXT, or unset it" $v.kafka.securityProtocol) }}
{{- end }}
{{- if and $v.kafka.sasl.usernameAsFile $v.kafka.sasl.passwordAsFile (eq $v.kafka.sasl.usernameKey $v.kafka.sasl.passwordKey) }}
{{- fail (printf "kafka.sasl.usernameKey and kafka.sasl.passwordKey are both %q: the username and the password are two keys of the Secret" $v.kafka.sasl.usernameKey) }}
{{- end }}
{{- if and $v.kafka.ssl.keyPasswordAsFile (not $v.kafka.ssl.keyPasswordSecret) }}
{{- fail "kafka.ssl.keyPasswordAsFile is set but kafka.ssl.keyPasswordSecret is not: it mounts the passphrase of that Secret; set both, or neither" }}
{{- end }}
{{- if and $v.kafka.ssl.keyPasswordSecret (not $v.kafka.ssl.clientCertSecret) }}
{{- fail "kafka.ssl.keyPasswordSecret is set but kafka.ssl.clientCertSecret is not: the passphrase is for the client key in that Secret; set both, or neither" }}
{{- end }}
{{- if and (eq $v.mode "standalone") $v.autoscaling.enabled }}
{{- if gt (int $v.autoscaling.minReplicas) (int $v.autoscaling.maxReplicas) }}
{{- fail (printf "autoscaling.minReplicas (%d) must be <= autoscaling.maxReplicas (%d)" (int $v.autoscaling.minReplicas) (int $v.autoscaling.maxReplicas)) }}
{{- end }}
{{- if gt (int $v.autoscaling.maxReplicas) (int $v.topics.partitions) }}
{{- fail (printf "autoscaling.maxReplicas (%d) must be <= topics.partitions (%d): a consumer group gives each partition to one consumer, the rest sit idle" (int $v.autoscaling.maxReplicas) (int $v.topics.partitions)) }}
{{- end }}
{{- end }}
{{- if and $v.metrics.podMonitor.enabled (eq $v.mode "inject") (not $v.metrics.podMonitor.selector) }}
{{- fail "metrics.podMonitor.selector is required in inject mode: the labels of the LLM pods that carry the sidecar" }}
{{- end }}
{{- if and $v.metrics.serviceMonitor.enabled (or (ne $v.mode "standalone") (not $v.service.enabled) (not $v.metrics.prometheus.enabled)) }}
{{- fail "metrics.serviceMonitor needs mode=standalone, service.enabled and metrics.prometheus.enabled (use metrics.podMonitor for injected sidecars)" }}
{{- end }}
{{- if and $v.metrics.serviceMonitor.enabled $v.metrics.podMonitor.enabled }}
{{- fail "metrics.serviceMonitor and metrics.podMonitor are both enabled: Prometheus would scrape every pod twice, under two jobs, and every sum (verdicts, dead letters, the fleet's coverage counts) would double; enable one (podMonitor for injected sidecars)" }}
{{- end }}
{{- if and $v.metrics.podMonitor.enabled (not $v.metrics.prometheus.enabled) }}
{{- fail "metrics.podMonitor needs metrics.prometheus.enabled" }}
{{- end }}
{{- if and $v.metrics.prometheus.enabled (eq (int $v.metrics.prometheus.port) (int $v.http.port)) }}
{{- fail (printf "metrics.prometheus.port and http.port are both %d: the metrics and the health endpoints need two different ports" (int $v.http.port)) }}
{{- end }}
{{- if and (eq $v.mode "standalone") (lt (int $v.terminationGracePeriodSeconds) (add1 (div (int $v.shutdownGraceMs) 1000))) }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must be above shutdownGraceMs (%d ms): the kubelet would kill the sidecar before it has drained" (int $v.terminationGracePeriodSeconds) (int $v.shutdownGraceMs)) }}
{{- end }}
{{- end }}
