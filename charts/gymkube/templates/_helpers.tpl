{{/*
Chart name, truncated to the 63 characters a label value allows.
*/}}
{{- define "gymkube.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified app name: the release name, suffixed with the chart name unless it contains it.
*/}}
{{- define "gymkube.fullname" -}}
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

{{/*
Chart name and version, for the helm.sh/chart label.
*/}}
{{- define "gymkube.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Recommended labels on every object of the release.
*/}}
{{- define "gymkube.labels" -}}
helm.sh/chart: {{ include "gymkube.chart" . }}
{{ include "gymkube.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: gymkube
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
Selector labels: stable across upgrades (no versions), since Deployment selectors are immutable.
*/}}
{{- define "gymkube.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gymkube.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Name of the operator's ServiceAccount.
*/}}
{{- define "gymkube.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gymkube.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
An image reference from {repository, tag}; an empty tag means the chart's appVersion.
*/}}
{{- define "gymkube.image" -}}
{{- printf "%s:%s" .image.repository (default .context.Chart.AppVersion .image.tag) }}
{{- end }}

{{/*
The namespaces the operator watches: the watch list, or none for the whole cluster.
*/}}
{{- define "gymkube.clusterWide" -}}
{{- if not .Values.watchNamespaces }}true{{ end }}
{{- end }}

{{/*
A label map as the operator's *_LABELS settings read it: key=value,key=value (sorted keys).
*/}}
{{- define "gymkube.labelList" -}}
{{- $pairs := list }}
{{- range $key, $value := . }}
{{- $pairs = append $pairs (printf "%s=%s" $key $value) }}
{{- end }}
{{- join "," $pairs }}
{{- end }}
