{{/* The chart's name. */}}
{{- define "kcapi.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name, used for every object. */}}
{{- define "kcapi.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "kcapi.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "kcapi.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "kcapi.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kcapi.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kcapi.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "kcapi.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "kcapi.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kcapi.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* "true" when the topology is the management cluster; fails on an unknown topology. */}}
{{- define "kcapi.inManagementCluster" -}}
{{- if eq .Values.topology "management-cluster" }}true
{{- else if ne .Values.topology "workload-cluster" }}
{{- fail (printf "topology must be workload-cluster or management-cluster, not %q" .Values.topology) }}
{{- end }}
{{- end }}

{{/* The Cluster's namespace the provider is scoped to ("" for all namespaces). */}}
{{- define "kcapi.clusterNamespace" -}}
{{- if include "kcapi.inManagementCluster" . }}
{{- if and .Values.clusterAPI.namespace (ne .Values.clusterAPI.namespace .Release.Namespace) }}
{{- fail (printf "topology management-cluster: install the release into the Cluster's namespace %q (clusterAPI.namespace), not %q" .Values.clusterAPI.namespace .Release.Namespace) }}
{{- end }}
{{- .Release.Namespace }}
{{- else }}
{{- .Values.clusterAPI.namespace }}
{{- end }}
{{- end }}

{{/* "true" when the provider installs the CRDs in the workload cluster. */}}
{{- define "kcapi.installWorkloadCRDs" -}}
{{- $v := toString .Values.installWorkloadCRDs }}
{{- if eq $v "" }}
{{- include "kcapi.inManagementCluster" . }}
{{- else if eq $v "true" }}true
{{- else if ne $v "false" }}
{{- fail (printf "installWorkloadCRDs must be true, false or empty, not %q" $v) }}
{{- end }}
{{- end }}

{{/* FEATURE_GATES from the featureGates map, in a stable order. */}}
{{- define "kcapi.featureGates" -}}
{{- $gates := list }}
{{- range $name := keys .Values.featureGates | sortAlpha }}
{{- $gates = append $gates (printf "%s=%v" $name (get $.Values.featureGates $name)) }}
{{- end }}
{{- join "," $gates }}
{{- end }}

{{/* The rules of a role file in rbac/ (copies of config/rbac made by `make generate`). */}}
{{- define "kcapi.rules" -}}
{{- $role := .root.Files.Get (printf "rbac/%s" .file) | fromYaml }}
{{- if not $role.rules }}
{{- fail (printf "rbac/%s has no rules" .file) }}
{{- end }}
{{- toYaml $role.rules }}
{{- end }}
