{{/* Names and labels shared by the templates. */}}

{{- define "mpjob.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "mpjob.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/*
A name that must be a DNS label (63 characters: a Service's), made of the full name and a
suffix, given (list . "<suffix>"). The full name is shortened, never the suffix: the same
release always gets the same name, and it still says what the object is. The chart's other
objects take DNS subdomains or path segments (253 characters), which the full name (at most
63) with its suffix always fits: their names are not shortened.
*/}}
{{- define "mpjob.dnsLabelName" -}}
{{- $suffix := index . 1 -}}
{{- $base := include "mpjob.fullname" (index . 0) | trunc (int (sub 62 (len $suffix))) | trimSuffix "-" -}}
{{- printf "%s-%s" $base $suffix -}}
{{- end -}}

{{- define "mpjob.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mpjob.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "mpjob.commonLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "mpjob.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: mpjob
{{- end -}}

{{- define "mpjob.labels" -}}
{{ include "mpjob.commonLabels" . }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "mpjob.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "mpjob.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "mpjob.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "mpjob.trainerImage" -}}
{{- default (printf "mpjob-trainer:%s" .Chart.AppVersion) .Values.trainerImage -}}
{{- end -}}

{{/* Namespaces the operator watches: empty means cluster-wide. Deduplicated, in order. */}}
{{- define "mpjob.watchNamespaces" -}}
{{- .Values.watchNamespaces | uniq | toJson -}}
{{- end -}}

{{/* Where `helm test` runs its job: the release namespace unless the operator does not watch it. */}}
{{- define "mpjob.testNamespace" -}}
{{- $ns := .Values.watchNamespaces | uniq -}}
{{- if or (not $ns) (has .Release.Namespace $ns) -}}
{{- .Release.Namespace -}}
{{- else -}}
{{- first $ns -}}
{{- end -}}
{{- end -}}

{{/*
Whether the operator Deployment rolls (RollingUpdate) rather than being replaced (Recreate),
given (dict "peering" <peering.enabled> "running" <the Deployment in the cluster, or empty>).
Peers see each other, so with peering the new operator stands by beside the old one. Not when
the running operator is standalone (peering being turned on): it knows no peering, and both
would act until it has gone, so it is replaced this once.
*/}}
{{- define "mpjob.rolls" -}}
{{- if .peering -}}
{{- $standalone := false -}}
{{- range (dig "spec" "template" "spec" "containers" list .running) -}}
{{- if eq (get . "name") "operator" -}}
{{- $standalone = true -}}
{{- range (get . "args" | default list) -}}
{{- if hasPrefix "--peering=" . }}{{ $standalone = false }}{{ end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if not $standalone }}true{{ end -}}
{{- end -}}
{{- end -}}

{{/* How long `helm test` must wait: the test job's own deadline, and its pod's start (image pull). */}}
{{- define "mpjob.testTimeout" -}}
{{- printf "%ds" (add (int .Values.tests.timeoutSeconds) 120) -}}
{{- end -}}

{{/*
The operator's --network-policy JSON (MPJOB_NETWORK_POLICY): who besides an attempt's own pods
may connect to its trainers' metrics port. The operator's own pods are found by the
Deployment's selector labels in the release namespace.
*/}}
{{- define "mpjob.networkPolicy" -}}
{{- $monitoring := .Values.networkPolicy.monitoring | default dict -}}
{{- $policy := dict "operatorNamespace" .Release.Namespace "operatorLabels" (include "mpjob.selectorLabels" . | fromYaml) -}}
{{- with $monitoring.namespaceSelector -}}
{{- if not (or .matchLabels .matchExpressions) -}}
{{- fail "networkPolicy.monitoring.namespaceSelector selects every namespace: name them (matchLabels), say so explicitly (matchExpressions: [{key: kubernetes.io/metadata.name, operator: Exists}]), or set it to null for none" -}}
{{- end -}}
{{- $_ := set $policy "monitoringNamespaces" . -}}
{{- $_ := set $policy "monitoringPods" ($monitoring.podSelector | default dict) -}}
{{- end -}}
{{- toJson $policy -}}
{{- end -}}
