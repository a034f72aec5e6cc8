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

{{/* repository:tag, or repository@digest when a digest is set: the digest is what
runs (a released chart sets it, with the version's tag beside it in values.yaml). */}}
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

{{/* The owner on the rows this release writes: registry.owner. The release named
student-controller may leave it empty for the controller's default, student-controller,
as config/default does. Any other release must say it: a default named after the release
would move the rows of a release that chart 0.1.0 installed (they carry
student-controller) to an owner that finds them all owned elsewhere, and a renderer
that cannot see the running release (helm template, as GitOps tools run it) could not
tell. */}}
{{- define "student-controller.owner" -}}
{{- $name := include "student-controller.fullname" . -}}
{{- if .Values.registry.owner -}}
{{- .Values.registry.owner -}}
{{- else if eq $name "student-controller" -}}
student-controller
{{- else -}}
{{- fail (printf "registry.owner is empty, and the release %s is not named student-controller: set registry.owner. For a new release, a name of its own (registry.owner=%s) keeps its rows apart from other releases'. For a release that chart 0.1.0 installed, whose rows carry the owner student-controller, set registry.owner=student-controller, or move the rows first with `student-controller registry rename-owner` (docs/install.md, \"Several releases\")" .Release.Name $name) -}}
{{- end -}}
{{- end -}}
