{{/*
The sidecar as reusable pieces. This chart's own Deployment uses them, and so
does any LLM service chart that injects the guardrail into its pods:

  # the LLM chart's Chart.yaml
  dependencies:
    - name: guardrail-sidecar
      alias: guardrail
      version: 0.1.x
      repository: file://../../charts/guardrail-sidecar   # or an OCI / HTTP repo
  # its values.yaml
  guardrail:
    mode: inject
  # its Deployment
  {{- $g := .Subcharts.guardrail }}
  metadata:
    annotations: {{- include "guardrail-sidecar.podAnnotations" $g | nindent 8 }}
  spec:
    enableServiceLinks: false   # no GUARDRAIL_<SERVICE>_* variables from the kubelet
    containers:
      - name: llm
        ...
      {{- include "guardrail-sidecar.container" $g | nindent 6 }}
    volumes:
      {{- include "guardrail-sidecar.volumes" $g | nindent 6 }}

Each helper takes the guardrail chart's own root context (`.` here,
`.Subcharts.<alias>` in the parent), so the values, names and ConfigMaps match
what this chart renders. Every item is a list entry ("- name: ..."); volume
names start with "guardrail-" so they do not clash with the LLM pod's.
*/}}

{{/* The container: a list item for `containers:` (or `initContainers:` with inject.nativeSidecar). */}}
{{- define "guardrail-sidecar.container" -}}
{{- include "guardrail-sidecar.validate" . }}
{{- $v := .Values -}}
- name: {{ $v.containerName }}
  image: {{ include "guardrail-sidecar.image" . | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  {{- if and (eq $v.mode "inject") $v.inject.nativeSidecar }}
  restartPolicy: Always
  {{- end }}
  {{- with $v.args }}
  args:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  ports:
    - name: guardrail-http
      containerPort: {{ $v.http.port }}
      protocol: TCP
    {{- if $v.metrics.prometheus.enabled }}
    - name: guardrail-prom
      containerPort: {{ $v.metrics.prometheus.port }}
      protocol: TCP
    {{- end }}
  env:
    {{- include "guardrail-sidecar.env" . | nindent 4 }}
  {{- with $v.extraEnvFrom }}
  envFrom:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.probes.startup }}
  {{- if .enabled }}
  startupProbe:
    httpGet:
      path: /livez
      port: guardrail-http
    periodSeconds: {{ .periodSeconds }}
    failureThreshold: {{ .failureThreshold }}
    timeoutSeconds: {{ .timeoutSeconds }}
  {{- end }}
  {{- end }}
  {{- with $v.probes.liveness }}
  {{- if .enabled }}
  livenessProbe:
    httpGet:
      path: /livez
      port: guardrail-http
    periodSeconds: {{ .periodSeconds }}
    failureThreshold: {{ .failureThreshold }}
    timeoutSeconds: {{ .timeoutSeconds }}
  {{- end }}
  {{- end }}
  {{- with $v.probes.readiness }}
  {{- if .enabled }}
  readinessProbe:
    httpGet:
      path: /readyz
      port: guardrail-http
    periodSeconds: {{ .periodSeconds }}
    failureThreshold: {{ .failureThreshold }}
    timeoutSeconds: {{ .timeoutSeconds }}
  {{- end }}
  {{- end }}
  {{- with $v.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    {{- include "guardrail-sidecar.volumeMounts" . | nindent 4 }}
{{- end }}

{{/*
Environment: GUARDRAIL_<SECTION>__<FIELD>, the sidecar's pydantic-settings
convention. Credentials only ever come from Secrets.
*/}}
{{- define "guardrail-sidecar.env" -}}
{{- $v := .Values -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: GUARDRAIL_LOG_LEVEL
  value: {{ $v.logLevel | quote }}
- name: GUARDRAIL_SHUTDOWN_GRACE_MS
  value: {{ $v.shutdownGraceMs | int64 | toString | quote }}
- name: GUARDRAIL_HTTP__PORT
  value: {{ $v.http.port | toString | quote }}
- name: GUARDRAIL_HTTP__HOST
  value: {{ $v.http.listenAddress | quote }}
{{- if eq $v.mode "inject" }}
{{- /* injected into an LLM pod: its readiness does not wait for the consumer group join */}}
- name: GUARDRAIL_HTTP__READY_REQUIRES_ASSIGNMENT
  value: "false"
{{- /* nor does its start: Kafka away keeps it live (not ready), trying again */}}
- name: GUARDRAIL_KAFKA__WAIT_AT_START
  value: "true"
{{- end }}
- name: GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS
  value: {{ $v.kafka.bootstrapServers | quote }}
- name: GUARDRAIL_KAFKA__GROUP_ID
  value: {{ $v.kafka.groupId | quote }}
{{- if $v.kafka.staticMembership }}
{{- /* static membership (KIP-345): the pod name is a stable, unique group.instance.id */}}
- name: GUARDRAIL_KAFKA__GROUP_INSTANCE_ID
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- end }}
{{- with $v.kafka.clientId }}
- name: GUARDRAIL_KAFKA__CLIENT_ID
  value: {{ . | quote }}
{{- end }}
- name: GUARDRAIL_KAFKA__SECURITY_PROTOCOL
  value: {{ $v.kafka.securityProtocol | quote }}
- name: GUARDRAIL_KAFKA__AUTO_OFFSET_RESET
  value: {{ $v.kafka.autoOffsetReset | quote }}
{{- with $v.kafka.isolationLevel }}
- name: GUARDRAIL_KAFKA__ISOLATION_LEVEL
  value: {{ . | quote }}
{{- end }}
{{- if hasPrefix "SASL" $v.kafka.securityProtocol }}
- name: GUARDRAIL_KAFKA__SASL_MECHANISM
  value: {{ $v.kafka.sasl.mechanism | quote }}
{{- if $v.kafka.sasl.usernameAsFile }}
- name: GUARDRAIL_KAFKA__SASL_USERNAME_FILE
  value: {{ printf "/etc/guardrail/kafka-sasl/%s" $v.kafka.sasl.usernameKey | quote }}
{{- else }}
- name: GUARDRAIL_KAFKA__SASL_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ $v.kafka.sasl.existingSecret }}
      key: {{ $v.kafka.sasl.usernameKey }}
{{- end }}
{{- if $v.kafka.sasl.passwordAsFile }}
- name: GUARDRAIL_KAFKA__SASL_PASSWORD_FILE
  value: {{ printf "/etc/guardrail/kafka-sasl/%s" $v.kafka.sasl.passwordKey | quote }}
{{- else }}
- name: GUARDRAIL_KAFKA__SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $v.kafka.sasl.existingSecret }}
      key: {{ $v.kafka.sasl.passwordKey }}
{{- end }}
{{- end }}
{{- if $v.judge.apiKeySecret }}
- name: GUARDRAIL_JUDGE__API_KEY_FILE
  value: {{ printf "/etc/guardrail/judge/%s" $v.judge.apiKeyKey | quote }}
{{- end }}
{{- if $v.kafka.ssl.caSecret }}
- name: GUARDRAIL_KAFKA__SSL_CAFILE
  value: {{ printf "/etc/guardrail/kafka-ca/%s" $v.kafka.ssl.caKey | quote }}
{{- end }}
{{- if $v.kafka.ssl.clientCertSecret }}
- name: GUARDRAIL_KAFKA__SSL_CERTFILE
  value: /etc/guardrail/kafka-client/tls.crt
- name: GUARDRAIL_KAFKA__SSL_KEYFILE
  value: /etc/guardrail/kafka-client/tls.key
{{- end }}
{{- if and $v.kafka.ssl.keyPasswordSecret $v.kafka.ssl.keyPasswordAsFile }}
- name: GUARDRAIL_KAFKA__SSL_KEY_PASSWORD_FILE
  value: {{ printf "/etc/guardrail/kafka-key-password/%s" $v.kafka.ssl.keyPasswordKey | quote }}
{{- else if $v.kafka.ssl.keyPasswordSecret }}
- name: GUARDRAIL_KAFKA__SSL_KEY_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $v.kafka.ssl.keyPasswordSecret }}
      key: {{ $v.kafka.ssl.keyPasswordKey }}
{{- end }}
- name: GUARDRAIL_TOPICS__RETRIEVAL
  value: {{ $v.topics.retrieval | quote }}
- name: GUARDRAIL_TOPICS__GENERATION
  value: {{ $v.topics.generation | quote }}
- name: GUARDRAIL_TOPICS__CLAIMS
  value: {{ $v.topics.claims | quote }}
- name: GUARDRAIL_TOPICS__VERDICTS
  value: {{ $v.topics.verdicts | quote }}
- name: GUARDRAIL_TOPICS__DLQ
  value: {{ $v.topics.dlq | quote }}
- name: GUARDRAIL_TOPICS__FEEDBACK
  value: {{ $v.topics.feedback | quote }}
- name: GUARDRAIL_TOPICS__REPORTS
  value: {{ $v.topics.reports | quote }}
- name: GUARDRAIL_TOPICS__CERTIFICATES
  value: {{ $v.topics.certificates | quote }}
{{- with $v.qdrant.url }}
- name: GUARDRAIL_QDRANT__URL
  value: {{ . | quote }}
{{- end }}
- name: GUARDRAIL_MODELS__DIR
  value: {{ $v.models.dir | quote }}
{{- if include "guardrail-sidecar.policyConfigMap" . }}
- name: GUARDRAIL_POLICY__FILE
  value: {{ printf "%s/%s" (trimSuffix "/" $v.policy.mountPath) $v.policy.key | quote }}
{{- end }}
{{- if $v.metrics.prometheus.enabled }}
- name: GUARDRAIL_METRICS__PROMETHEUS_PORT
  value: {{ $v.metrics.prometheus.port | toString | quote }}
- name: GUARDRAIL_METRICS__PROMETHEUS_HOST
  value: {{ $v.http.listenAddress | quote }}
{{- end }}
- name: OTEL_SERVICE_NAME
  value: {{ default (include "guardrail-sidecar.name" .) $v.otel.serviceName | quote }}
{{- $attrs := list "k8s.pod.name=$(POD_NAME)" "k8s.namespace.name=$(POD_NAMESPACE)" }}
{{- range $key, $value := $v.otel.resourceAttributes }}
{{- /* values are percent-encoded (the W3C baggage format the SDK parses): "," and "=" */}}
{{- $encoded := toString $value | replace "%" "%25" | replace "," "%2C" | replace "=" "%3D" | replace " " "%20" }}
{{- $attrs = append $attrs (printf "%s=%s" $key $encoded) }}
{{- end }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ join "," $attrs | quote }}
{{- with $v.otel.endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ . | quote }}
{{- end }}
{{- with $v.otel.protocol }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ . | quote }}
{{- end }}
{{- with $v.otel.sampler }}
- name: OTEL_TRACES_SAMPLER
  value: {{ . | quote }}
{{- end }}
{{- if ne (toString $v.otel.samplerArg) "" }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ $v.otel.samplerArg | toString | quote }}
{{- end }}
- name: GUARDRAIL_TRACING__STAGE_SPANS
  value: {{ $v.otel.stageSpans | toString | quote }}
{{- with $v.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The container's mounts. /tmp is the only writable path. */}}
{{- define "guardrail-sidecar.volumeMounts" -}}
{{- $v := .Values -}}
- name: guardrail-tmp
  mountPath: /tmp
{{- if $v.models.volume }}
- name: guardrail-models
  mountPath: {{ $v.models.dir }}
  readOnly: true
{{- end }}
{{- if include "guardrail-sidecar.policyConfigMap" . }}
- name: guardrail-policy
  mountPath: {{ $v.policy.mountPath }}
  readOnly: true
{{- end }}
{{- if $v.kafka.ssl.caSecret }}
- name: guardrail-kafka-ca
  mountPath: /etc/guardrail/kafka-ca
  readOnly: true
{{- end }}
{{- if $v.kafka.ssl.clientCertSecret }}
- name: guardrail-kafka-client
  mountPath: /etc/guardrail/kafka-client
  readOnly: true
{{- end }}
{{- if and $v.kafka.ssl.keyPasswordSecret $v.kafka.ssl.keyPasswordAsFile }}
- name: guardrail-kafka-key-password
  mountPath: /etc/guardrail/kafka-key-password
  readOnly: true
{{- end }}
{{- if and (hasPrefix "SASL" $v.kafka.securityProtocol) (or $v.kafka.sasl.passwordAsFile $v.kafka.sasl.usernameAsFile) }}
- name: guardrail-kafka-sasl
  mountPath: /etc/guardrail/kafka-sasl
  readOnly: true
{{- end }}
{{- if $v.judge.apiKeySecret }}
- name: guardrail-judge
  mountPath: /etc/guardrail/judge
  readOnly: true
{{- end }}
{{- with $v.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The pod volumes the container needs: list items for `volumes:`. */}}
{{- define "guardrail-sidecar.volumes" -}}
{{- $v := .Values -}}
- name: guardrail-tmp
  emptyDir:
    {{- with $v.tmp.medium }}
    medium: {{ . }}
    {{- end }}
    {{- with $v.tmp.sizeLimit }}
    sizeLimit: {{ . }}
    {{- end }}
{{- with $v.models.volume }}
- name: guardrail-models
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with include "guardrail-sidecar.policyConfigMap" . }}
- name: guardrail-policy
  configMap:
    name: {{ . }}
    items:
      - key: {{ $v.policy.key }}
        path: {{ $v.policy.key }}
{{- end }}
{{- if $v.kafka.ssl.caSecret }}
- name: guardrail-kafka-ca
  secret:
    secretName: {{ $v.kafka.ssl.caSecret }}
    items:
      - key: {{ $v.kafka.ssl.caKey }}
        path: {{ $v.kafka.ssl.caKey }}
{{- end }}
{{- if $v.kafka.ssl.clientCertSecret }}
- name: guardrail-kafka-client
  secret:
    secretName: {{ $v.kafka.ssl.clientCertSecret }}
{{- end }}
{{- if and $v.kafka.ssl.keyPasswordSecret $v.kafka.ssl.keyPasswordAsFile }}
- name: guardrail-kafka-key-password
  secret:
    secretName: {{ $v.kafka.ssl.keyPasswordSecret }}
    items:
      - key: {{ $v.kafka.ssl.keyPasswordKey }}
        path: {{ $v.kafka.ssl.keyPasswordKey }}
{{- end }}
{{- /* whole directories, never subPath: the kubelet updates these files when the
Secret changes, and the sidecar reads them again (a subPath mount is never updated) */ -}}
{{- if and (hasPrefix "SASL" $v.kafka.securityProtocol) (or $v.kafka.sasl.passwordAsFile $v.kafka.sasl.usernameAsFile) }}
- name: guardrail-kafka-sasl
  secret:
    secretName: {{ $v.kafka.sasl.existingSecret }}
    items:
{{- if $v.kafka.sasl.usernameAsFile }}
      - key: {{ $v.kafka.sasl.usernameKey }}
        path: {{ $v.kafka.sasl.usernameKey }}
{{- end }}
{{- if $v.kafka.sasl.passwordAsFile }}
      - key: {{ $v.kafka.sasl.passwordKey }}
        path: {{ $v.kafka.sasl.passwordKey }}
{{- end }}
{{- end }}
{{- with $v.judge.apiKeySecret }}
- name: guardrail-judge
  secret:
    secretName: {{ . }}
    items:
      - key: {{ $v.judge.apiKeyKey }}
        path: {{ $v.judge.apiKeyKey }}
{{- end }}
{{- end }}

{{/* Pod annotations that roll the pods when the inline policy changes (a map). */}}
{{- define "guardrail-sidecar.podAnnotations" -}}
{{- if and .Values.policy.inline (not .Values.policy.existingConfigMap) }}
checksum/guardrail-policy: {{ .Values.policy.inline | sha256sum }}
{{- else }}
{{- /* an empty map keeps `annotations:` valid YAML in the parent */ -}}
{}
{{- end }}
{{- end }}
