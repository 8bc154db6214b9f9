{{/* Names, labels, images and addresses shared by the templates. */}}

{{- define "inferix.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release-wide prefix of every resource name (component names are appended to it). */}}
{{- define "inferix.fullname" -}}
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

{{- define "inferix.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels of one component: (dict "root" $ "component" "scheduler") */}}
{{- define "inferix.selectorLabels" -}}
app.kubernetes.io/name: {{ include "inferix.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "inferix.labels" -}}
helm.sh/chart: {{ include "inferix.chart" .root }}
{{ include "inferix.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: inferix
{{- end }}

{{- define "inferix.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "inferix.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Image of an Inferix component: (dict "root" $ "image" .Values.scheduler.image "name" "scheduler") */}}
{{- define "inferix.image" -}}
{{- $repository := .image.repository | default (printf "%s/%s" .root.Values.image.registry .name) }}
{{- $tag := .image.tag | default .root.Values.image.tag | default .root.Chart.AppVersion }}
{{- printf "%s:%s" $repository $tag }}
{{- end }}

{{- define "inferix.workerImageName" -}}
{{- if .Values.worker.gpu.enabled }}worker-cuda{{ else }}worker-cpu{{ end }}
{{- end }}

{{- define "inferix.workerDevice" -}}
{{- if .Values.worker.device }}{{ .Values.worker.device }}{{ else if .Values.worker.gpu.enabled }}cuda{{ else }}cpu{{ end }}
{{- end }}

{{/* In-cluster addresses (host:port) of the services. */}}
{{/* Where the mesh's own services reach the scheduler (plaintext): its internal Service when it serves TLS. */}}
{{- define "inferix.schedulerAddress" -}}
{{- if include "inferix.schedulerInternal" . -}}
{{ include "inferix.fullname" . }}-scheduler-internal:{{ .Values.scheduler.tls.internalPort }}
{{- else -}}
{{ include "inferix.fullname" . }}-scheduler:{{ .Values.scheduler.service.port }}
{{- end }}
{{- end }}
{{/* "true" when the scheduler has an internal port for the mesh (TLS mode pod, or mesh TLS), else "". */}}
{{- define "inferix.schedulerInternal" -}}
{{- if or (eq .Values.scheduler.tls.mode "pod") .Values.meshTls.enabled }}true{{ end }}
{{- end }}
{{- define "inferix.kvcacheAddress" -}}
{{ include "inferix.fullname" . }}-kvcache:{{ .Values.kvcache.service.port }}
{{- end }}
{{- define "inferix.streamerAddress" -}}
{{ include "inferix.fullname" . }}-streamer:{{ .Values.streamer.service.port }}
{{- end }}
{{- define "inferix.workerHeadless" -}}
{{ include "inferix.fullname" . }}-worker
{{- end }}
{{/* The viewer page's server as browsers reach it (scheduler --viewer-page-url). */}}
{{- define "inferix.viewerPageUrl" -}}
{{- if .Values.streamer.viewer.publicUrl }}
{{- trimSuffix "/" .Values.streamer.viewer.publicUrl }}
{{- else if .Values.ingress.enabled }}
{{- printf "%s://%s%s" (ternary "https" "http" (not (empty .Values.ingress.tls))) (.Values.ingress.host | default "localhost") (trimSuffix "/" .Values.ingress.path) }}
{{- else }}
{{- printf "%s://127.0.0.1:%d" (ternary "https" "http" (not (empty .Values.streamer.viewer.tls.secretName))) (int .Values.streamer.service.viewerPort) }}
{{- end }}
{{- end }}

{{/* The RTMP application players read (scheduler --rtmp-play-url). */}}
{{- define "inferix.rtmpPlayUrl" -}}
{{- if .Values.rtmp.publicUrl }}
{{- trimSuffix "/" .Values.rtmp.publicUrl }}
{{- else }}
{{- printf "rtmp://127.0.0.1:%d/%s" (int .Values.rtmp.service.port) .Values.rtmp.application }}
{{- end }}
{{- end }}

{{- define "inferix.rtmpUrl" -}}
rtmp://{{ include "inferix.fullname" . }}-rtmp:{{ .Values.rtmp.service.port }}/{{ .Values.rtmp.application }}
{{- end }}

{{/* INFERIX_REDIS_URL of the scheduler and kvcache_svc. */}}
{{- define "inferix.redisEnv" -}}
{{- if .Values.redis.enabled }}
- name: INFERIX_REDIS_URL
  value: {{ printf "redis://%s-redis:%d/0" (include "inferix.fullname" .) (int .Values.redis.port) | quote }}
{{- else if .Values.redis.external.existingSecret }}
- name: INFERIX_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.redis.external.existingSecret }}
      key: {{ .Values.redis.external.existingSecretKey }}
{{- else if .Values.redis.external.url }}
- name: INFERIX_REDIS_URL
  value: {{ .Values.redis.external.url | quote }}
{{- else }}
{{- fail "redis: set redis.enabled, or redis.external.url / redis.external.existingSecret (the chart always uses Redis)" }}
{{- end }}
{{- end }}

{{/* Environment of every Inferix container: pod identity, HOME on the writable /tmp, OpenTelemetry. */}}
{{- define "inferix.commonEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: HOME
  value: /tmp
- name: INFERIX_INTERNAL_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "inferix.meshSecret" . }}
      key: internal-token
{{- if .Values.meshTls.enabled }}
# Mesh TLS (inferix/mesh_tls.py): the pod's Secret, mounted by "inferix.meshTlsVolumeMount".
- name: INFERIX_MESH_TLS_CA
  value: /etc/inferix/mesh-tls/ca.crt
- name: INFERIX_MESH_TLS_CERT
  value: /etc/inferix/mesh-tls/tls.crt
- name: INFERIX_MESH_TLS_KEY
  value: /etc/inferix/mesh-tls/tls.key
- name: INFERIX_HEALTH_PORT
  value: {{ .Values.meshTls.healthPort | quote }}
{{- end }}
{{- if .Values.otel.endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .Values.otel.endpoint | quote }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: "k8s.namespace.name=$(POD_NAMESPACE),k8s.pod.name=$(POD_NAME)"
{{- end }}
{{- end }}

{{/* Flags every service takes (inferix/server.py): (dict "root" $ "port" 50051 "grace" 30) */}}
{{- define "inferix.serverArgs" -}}
- --host=0.0.0.0
- --port={{ .port }}
{{- if .root.Values.metrics.enabled }}
- --metrics-port={{ .root.Values.metrics.port }}
{{- end }}
- --grace={{ .grace }}
- --log-level={{ .root.Values.logLevel }}
{{- end }}

{{/* Container ports of a service. */}}
{{- define "inferix.grpcPorts" -}}
- name: grpc
  containerPort: {{ .port }}
  protocol: TCP
{{- if .root.Values.metrics.enabled }}
- name: metrics
  containerPort: {{ .root.Values.metrics.port }}
  protocol: TCP
{{- end }}
{{- if .root.Values.meshTls.enabled }}
- name: health
  containerPort: {{ .root.Values.meshTls.healthPort }}
  protocol: TCP
{{- end }}
{{- end }}

{{/* gRPC health probes (grpc.health.v1): (dict "root" $ "port" 50051 "service" "inferix.v1.SchedulerService"
"startupSeconds" 120). Kubernetes' gRPC probes speak plaintext and present no certificate: with mesh TLS
they use the plaintext health-only port. */}}
{{- define "inferix.grpcProbes" -}}
{{- $port := .port }}
{{- if .root.Values.meshTls.enabled }}
{{- $port = .root.Values.meshTls.healthPort }}
{{- end }}
startupProbe:
  grpc:
    port: {{ $port }}
  periodSeconds: 5
  timeoutSeconds: 5
  failureThreshold: {{ div (add .startupSeconds 4) 5 }}
readinessProbe:
  grpc:
    port: {{ $port }}
    service: {{ .service }}
  periodSeconds: 5
  timeoutSeconds: 5
  failureThreshold: 2
livenessProbe:
  grpc:
    port: {{ $port }}
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 3
{{- end }}

{{- define "inferix.podSecurityContext" -}}
{{- toYaml .Values.podSecurityContext }}
{{- end }}

{{- define "inferix.containerSecurityContext" -}}
{{- toYaml .Values.containerSecurityContext }}
{{- end }}

{{- define "inferix.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The Secret holding the scheduler's API key file, and its key. */}}
{{- define "inferix.apiKeysSecret" -}}
{{- .Values.apiKeys.existingSecret | default (printf "%s-api-keys" (include "inferix.fullname" .)) }}
{{- end }}
{{- define "inferix.apiKeysSecretKey" -}}
{{- if .Values.apiKeys.existingSecret }}{{ .Values.apiKeys.existingSecretKey }}{{ else }}api-keys{{ end }}
{{- end }}

{{/* The Secret of the internal token and the viewer-link secret. */}}
{{- define "inferix.meshSecret" -}}
{{- .Values.meshSecret.existingSecret | default (printf "%s-mesh" (include "inferix.fullname" .)) }}
{{- end }}

{{/* INFERIX_VIEWER_SECRET of the scheduler (signs viewer links) and the streamer (checks them). */}}
{{- define "inferix.viewerSecretEnv" -}}
- name: INFERIX_VIEWER_SECRET
  valueFrom:
    secretKeyRef:
      name: {{ include "inferix.meshSecret" . }}
      key: viewer-secret
{{- end }}

{{/* Scheduling fields of a pod: nodeSelector, tolerations, affinity. */}}
{{- define "inferix.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Mesh TLS: the Secret of a component (dict "root" $ "component" "kvcache"), its volume and its mount. */}}
{{- define "inferix.meshTlsSecret" -}}
{{- index .root.Values.meshTls.secretNames .component | default (printf "%s-%s-mesh-tls" (include "inferix.fullname" .root) .component) }}
{{- end }}
{{- define "inferix.meshTlsVolume" -}}
{{- if .root.Values.meshTls.enabled }}
# The whole Secret, no subPath: the kubelet then updates the files in place when it is renewed.
- name: mesh-tls
  secret:
    secretName: {{ include "inferix.meshTlsSecret" . }}
    defaultMode: 0440
{{- end }}
{{- end }}
{{- define "inferix.meshTlsVolumeMount" -}}
{{- if .Values.meshTls.enabled }}
- name: mesh-tls
  mountPath: /etc/inferix/mesh-tls
  readOnly: true
{{- end }}
{{- end }}
