{{/* Chart name, truncated to a DNS label. */}}
{{- define "ddpjob-operator.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: the release name, plus the chart name unless the release already contains it. */}}
{{- define "ddpjob-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "ddpjob-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ddpjob-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "ddpjob-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "ddpjob-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: ddpjob
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "ddpjob-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ddpjob-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false: name an existing ServiceAccount" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "ddpjob-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The operator's RBAC rules for DDPJobs and their children, generated from operator/ddpjob_operator/permissions.py. */}}
{{- define "ddpjob-operator.rules" -}}
{{- (.Files.Get "files/rbac-rules.yaml" | fromYaml).jobs | toYaml }}
{{- end }}

{{/* Leader election's rules (the Lease), for a Role in the release namespace only. */}}
{{- define "ddpjob-operator.leaderElectionRules" -}}
{{- (.Files.Get "files/rbac-rules.yaml" | fromYaml).leaderElection | toYaml }}
{{- end }}

{{/* The Lease the replicas elect the active operator on (in the release namespace). */}}
{{- define "ddpjob-operator.leaseName" -}}
{{- include "ddpjob-operator.fullname" . }}
{{- end }}

{{/* The progress endpoint's rules (TokenReviews are cluster-scoped: a ClusterRole of their own). */}}
{{- define "ddpjob-operator.progressRules" -}}
{{- (.Files.Get "files/rbac-rules.yaml" | fromYaml).progress | toYaml }}
{{- end }}

{{/* What worker pods get as the base of DDPJOB_PROGRESS_URL: the progress Service. */}}
{{- define "ddpjob-operator.progressUrl" -}}
{{- printf "%s://%s:%v" (ternary "https" "http" (include "ddpjob-operator.progressTls" . | eq "true")) (include "ddpjob-operator.progressHost" .) .Values.progress.port }}
{{- end }}

{{/* The progress Service's DNS name (what the endpoint's certificate must be valid for). */}}
{{- define "ddpjob-operator.progressHost" -}}
{{- printf "%s-progress.%s.svc" (include "ddpjob-operator.fullname" .) .Release.Namespace }}
{{- end }}

{{/* "true" when the progress endpoint serves HTTPS. */}}
{{- define "ddpjob-operator.progressTls" -}}
{{- $tls := .Values.progress.tls | default dict }}
{{- and .Values.progress.enabled $tls.enabled | toString }}
{{- end }}

{{/* The Secret with the progress endpoint's certificate (tls.crt, tls.key, ca.crt). */}}
{{- define "ddpjob-operator.progressTlsSecret" -}}
{{- $tls := .Values.progress.tls | default dict }}
{{- $certManager := $tls.certManager | default dict }}
{{- if and (not $tls.secretName) (not $certManager.enabled) }}
{{- fail "progress.tls.enabled: set progress.tls.secretName (a kubernetes.io/tls Secret with tls.crt, tls.key and ca.crt) or progress.tls.certManager.enabled=true" }}
{{- end }}
{{- default (printf "%s-progress-tls" (include "ddpjob-operator.fullname" .)) $tls.secretName }}
{{- end }}
