#!/usr/bin/env bash
# Installs the outside checkers that `make lint` runs into bin/tools, each at the version
# pinned here, with `go install MODULE@VERSION`: every tool builds with the dependencies its
# own go.mod names (one shared tools module cannot hold them: kubectl-validate v0.0.4 needs
# a k8s.io/api that the others have moved past). A tool is rebuilt only when its version or
# the Go toolchain changes. Nothing comes from anywhere but the Go module proxy.
set -o errexit -o nounset -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${ROOT}/bin/tools"
mkdir -p "${BIN}"

# name  package@version
TOOLS=(
	"staticcheck honnef.co/go/tools/cmd/staticcheck@v0.8.2"
	"gosec github.com/securego/gosec/v2/cmd/gosec@v2.30.0"
	"govulncheck golang.org/x/vuln/cmd/govulncheck@v1.9.0"
	"kube-score github.com/zegl/kube-score/cmd/kube-score@v1.20.0"
	"kubectl-validate sigs.k8s.io/kubectl-validate@v0.0.4"
)

goversion="$(go env GOVERSION)"
for entry in "${TOOLS[@]}"; do
	read -r name pkg <<<"${entry}"
	stamp="${BIN}/.${name}.version"
	if [[ -x "${BIN}/${name}" && -f "${stamp}" && "$(cat "${stamp}")" == "${pkg} ${goversion}" ]]; then
		continue
	fi
	echo "tools: installing ${pkg} (${goversion}) ..."
	GOBIN="${BIN}" go install "${pkg}"
	echo "${pkg} ${goversion}" >"${stamp}"
done
