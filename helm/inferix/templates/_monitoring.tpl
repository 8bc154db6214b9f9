{{/* Selection of this release's series in Prometheus, shared by the alerts and the autoscalers. */}}

{{/* The labels (a dict): monitoring.metricLabels, or those the chart's ServiceMonitor gives the series. */}}
{{- define "inferix.metricLabels" -}}
{{- $labels := .Values.monitoring.metricLabels }}
{{- if not $labels }}
{{- $labels = dict "namespace" .Release.Namespace "service" (printf "%s-metrics" (include "inferix.fullname" .)) }}
{{- end }}
{{- toYaml $labels }}
{{- end }}

{{/* The same labels as PromQL matchers: namespace="ns",service="name-metrics" */}}
{{- define "inferix.metricMatchers" -}}
{{- $labels := include "inferix.metricLabels" . | fromYaml }}
{{- $matchers := list }}
{{- range $key := keys $labels | sortAlpha }}
{{- $matchers = append $matchers (printf "%s=%s" $key (get $labels $key | toJson)) }}
{{- end }}
{{- join "," $matchers }}
{{- end }}

{{/* The demand query of the worker autoscaler (autoscaling/prometheus-adapter-values.yaml), its
     <<.LabelMatchers>> replaced by this release's matchers (KEDA runs it as it is). */}}
{{- define "inferix.workerDemandRule" -}}
{{- $rules := .Files.Get "autoscaling/prometheus-adapter-values.yaml" | fromYaml }}
{{- toYaml (first $rules.rules.external) }}
{{- end }}

{{/* Scaling behaviour of the worker pool (HPA and KEDA alike): scale up by at most scaleUpPods per
     period; scale down only after the stabilization window, one pod per period (each drains first). */}}
{{- define "inferix.workerScalingBehavior" -}}
{{- $a := .Values.worker.autoscaling -}}
scaleUp:
  stabilizationWindowSeconds: 0
  selectPolicy: Max
  policies:
    - type: Pods
      value: {{ $a.scaleUpPods }}
      periodSeconds: {{ $a.scaleUpPeriodSeconds }}
scaleDown:
  stabilizationWindowSeconds: {{ $a.scaleDownStabilizationSeconds }}
  selectPolicy: Min
  policies:
    - type: Pods
      value: 1
      periodSeconds: {{ $a.scaleDownPeriodSeconds }}
{{- end }}
