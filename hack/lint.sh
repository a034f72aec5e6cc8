#!/usr/bin/env bash
# make lint: the outside checkers, at the versions hack/install-tools.sh pins, on the
# code, the manifests as they are applied, the Helm chart and its alerts. Exceptions live beside what they excuse,
# each with its reason: `#nosec Gxxx -- why` in the code, pkg/generated/staticcheck.conf,
# a `kube-score/ignore` annotation in the manifest.
set -o errexit -o nounset -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"
hack/install-tools.sh
TOOLS="${ROOT}/bin/tools"
# staticcheck and gosec load the packages through go list: with the flags go vet
# compiled them with (make verify: static, -trimpath, the shipped tags) they find them
# compiled; with others, each checker compiled every package once more (gosec 3
# minutes in a cold run).
export CGO_ENABLED=0 GOFLAGS="-trimpath -tags=$(sed -n 's/^GO_TAGS := //p' Makefile)"
OUT="${ROOT}/bin/lint"
rm -rf "${OUT}" && mkdir -p "${OUT}"

# The Go vulnerability database as the Go module proxy serves it, and the API server's
# OpenAPI schemas of the Kubernetes release the project targets.
VULNDB="golang.org/x/vulndb@v0.0.0-20261105234957-e22db6528018"
module_dir() { go mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'; }

echo "lint: staticcheck"
"${TOOLS}/staticcheck" ./...

# The controller, its registry and API: every rule.
echo "lint: gosec, the product"
"${TOOLS}/gosec" -quiet -exclude-generated \
	./cmd/student-controller/... ./internal/controller/... ./internal/informer/... ./internal/registry/... ./internal/metricsauth/... ./pkg/apis/...
# What runs the tests, the bench and `make run`: it starts programs and writes files
# whose paths it makes itself, by design (G204 subprocess with a variable, G304 file
# path from a variable, G301/G306 permissions of result files meant to be read).
echo "lint: gosec, the tests and tools"
"${TOOLS}/gosec" -quiet -exclude=G204,G304,G301,G306 \
	./cmd/student-dev/... ./cmd/student-node/... ./internal/testenv/... ./test/...

# The image builder and the gosec command, modules of their own.
for module in image gosec; do
	echo "lint: staticcheck and gosec, hack/tools/${module}"
	(cd "hack/tools/${module}" && "${TOOLS}/staticcheck" . && "${TOOLS}/gosec" -quiet .)
done

echo "lint: govulncheck (${VULNDB}, $(go env GOVERSION))"
"${TOOLS}/govulncheck" -db "file://$(module_dir "${VULNDB}")/data/osv" ./...

# The manifests as they are applied: config/default, its PostgreSQL variant, the
# registry's claim and namespace and the samples as kustomize renders them, and the Helm
# chart with its default values.
for dir in namespace registry default postgres samples; do
	kubectl kustomize "config/${dir}" >"${OUT}/${dir}.yaml"
done
echo "lint: helm lint --strict"
"${TOOLS}/helm" lint --strict --kube-version 1.37.2 charts/student-controller
"${TOOLS}/helm" template student-controller charts/student-controller --namespace student-controller-system \
	--kube-version 1.37.2 >"${OUT}/chart.yaml"

echo "lint: promtool check rules, promtool test rules (the chart's alerts)"
"${TOOLS}/promtool" check rules charts/student-controller/files/alerts.yaml
(cd charts/student-controller/files && "${TOOLS}/promtool" test rules alerts_test.yaml)

echo "lint: kube-score"
for manifests in default postgres chart; do
	"${TOOLS}/kube-score" score "${OUT}/${manifests}.yaml"
done

echo "lint: all clean"
