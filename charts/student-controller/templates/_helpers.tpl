{{/* The name of the release's objects: the release name, with the chart's after it
unless the release name already holds it. */}}
{{- define "student-controller.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels of every object; the selector label is the one config/ uses. */}}
{{- define "student-controller.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "student-controller.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* repository:tag, or repository@digest when a digest is set. */}}
{{- define "student-controller.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* watchNamespace as the controller's --namespace: names separated by commas (a string
of them, or a list), sorted, each once; empty for every namespace. */}}
{{- define "student-controller.watchNamespaces" -}}
{{- $given := .Values.watchNamespace | default list -}}
{{- if not (kindIs "slice" $given) }}{{ $given = splitList "," (toString $given) }}{{ end -}}
{{- $names := list -}}
{{- range $given }}{{ with trim (toString .) }}{{ $names = append $names . }}{{ end }}{{ end -}}
{{- $names | uniq | sortAlpha | join "," -}}
{{- end -}}

{{/* watchSelector (a label selector: matchLabels and matchExpressions) as the
controller's --selector, which the admission policy's objectSelector matches too; empty
for every Student. Anything else in it is refused, not ignored: the API server would
drop it from the objectSelector and the policy would match every Student. */}}
{{- define "student-controller.watchSelector" -}}
{{- $terms := list -}}
{{- with .Values.watchSelector -}}
{{- range $key, $_ := . }}{{ if not (has $key (list "matchLabels" "matchExpressions")) }}{{ fail (printf "watchSelector: %q; want matchLabels and matchExpressions" $key) }}{{ end }}{{ end -}}
{{- range $key, $value := .matchLabels }}{{ $terms = append $terms (printf "%s=%s" $key (toString $value)) }}{{ end -}}
{{- range .matchExpressions -}}
{{- $values := list }}{{ range .values }}{{ $values = append $values (toString .) }}{{ end -}}
{{- if eq .operator "In" }}{{ $terms = append $terms (printf "%s in (%s)" .key (join "," $values)) }}
{{- else if eq .operator "NotIn" }}{{ $terms = append $terms (printf "%s notin (%s)" .key (join "," $values)) }}
{{- else if eq .operator "Exists" }}{{ $terms = append $terms .key }}
{{- else if eq .operator "DoesNotExist" }}{{ $terms = append $terms (printf "!%s" .key) }}
{{- else }}{{ fail (printf "watchSelector: operator %q; want In, NotIn, Exists or DoesNotExist" .operator) }}
{{- end -}}
{{- end -}}
{{- end -}}
{{- join "," $terms -}}
{{- end -}}

{{/* The owner mark on the rows this release writes: registry.owner, else the release's
fullname, so that two releases never share an owner by default. Charts before this one
left the controller's default, student-controller: an upgrade that would move a
release's rows to another owner fails instead (the new owner would find every row owned
elsewhere). Helm sees the running Deployment's owner on a real upgrade; without it
(helm template --is-upgrade, --dry-run=client) a release not named student-controller
is taken to carry the old default. */}}
{{- define "student-controller.owner" -}}
{{- $name := include "student-controller.fullname" . -}}
{{- $owner := .Values.registry.owner | default $name -}}
{{- if and .Release.IsUpgrade (not .Values.registry.owner) -}}
{{- $before := "" -}}
{{- $running := lookup "apps/v1" "Deployment" .Release.Namespace $name -}}
{{- if $running -}}
{{- $before = "student-controller" -}}
{{- range (dig "spec" "template" "spec" "containers" (list) $running) -}}
{{- if eq .name "controller" }}{{ range .args }}{{ if hasPrefix "--registry-owner=" . }}{{ $before = trimPrefix "--registry-owner=" . }}{{ end }}{{ end }}{{ end -}}
{{- end -}}
{{- else if ne $name "student-controller" -}}
{{- $before = "student-controller" -}}
{{- end -}}
{{- if and $before (ne $before $owner) -}}
{{- $why := ternary " (the owner every release had before the chart named it after the release)" "" (eq $before "student-controller") -}}
{{- fail (printf "registry.owner is empty, so this upgrade would mark the release's rows with the owner %s, but the rows it wrote carry %s%s, and %s would find them all owned elsewhere. Set registry.owner explicitly: %s to keep writing those rows, or %s once `student-controller registry rename-owner --registry URL --registry-owner %s --to %s` has moved them (docs/operating.md, \"Several releases\")" $owner $before $why $owner $before $owner $before $owner) -}}
{{- end -}}
{{- end -}}
{{- $owner -}}
{{- end -}}
