{{- define "autonode.name" -}}karpenter-clusterapi-autonode{{- end }}

{{- define "autonode.labels" -}}
app.kubernetes.io/name: {{ include "autonode.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "autonode.image" -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{/* The rules of the document of kind .kind in rbac/.file (controller-gen writes several). */}}
{{- define "autonode.rules" -}}
{{- $rules := "" }}
{{- range (regexSplit "(?m)^---$" (.root.Files.Get (printf "rbac/%s" .file)) -1) }}
{{- $doc := fromYaml . }}
{{- if and $doc (eq (default "" $doc.kind) $.kind) }}
{{- $rules = toYaml $doc.rules }}
{{- end }}
{{- end }}
{{- if not $rules }}
{{- fail (printf "rbac/%s has no %s" .file .kind) }}
{{- end }}
{{- $rules }}
{{- end }}
