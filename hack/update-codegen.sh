#!/usr/bin/env bash
# Regenerates everything derived from the API types in pkg/apis: deepcopy functions,
# the typed clientset, listers, informers and apply configurations under pkg/generated
# (k8s.io/code-generator's kube_codegen.sh), and the CRD under config/crd/bases
# (controller-gen). Generated files are never edited by hand; run this instead.
set -o errexit -o nounset -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"
THIS_PKG="$(go list -m)"

# kube_codegen.sh comes from the k8s.io/code-generator version pinned in go.mod. `go list`
# names the module's folder only once it is in the module cache, so download it first.
go mod download k8s.io/code-generator
CODEGEN_PKG="$(go list -m -f '{{.Dir}}' k8s.io/code-generator)"
if [[ ! -f "${CODEGEN_PKG}/kube_codegen.sh" ]]; then
	echo "kube_codegen.sh not found in k8s.io/code-generator (module folder: '${CODEGEN_PKG}')" >&2
	exit 1
fi
# shellcheck source=/dev/null
source "${CODEGEN_PKG}/kube_codegen.sh"

kube::codegen::gen_helpers \
	--boilerplate "${ROOT}/hack/boilerplate.go.txt" \
	"${ROOT}/pkg/apis"

# kube_codegen.sh looks for stale files in these folders; make sure they exist.
mkdir -p "${ROOT}"/pkg/generated/{applyconfiguration,clientset,listers,informers}
kube::codegen::gen_client \
	--with-watch \
	--with-applyconfig \
	--output-dir "${ROOT}/pkg/generated" \
	--output-pkg "${THIS_PKG}/pkg/generated" \
	--boilerplate "${ROOT}/hack/boilerplate.go.txt" \
	"${ROOT}/pkg/apis"

echo "Generating the CRD into config/crd/bases"
rm -rf "${ROOT}/config/crd/bases"
go tool controller-gen crd:crdVersions=v1 \
	paths="./pkg/apis/..." \
	output:crd:artifacts:config=config/crd/bases

# The Helm chart installs the same CRD from its crds/ folder.
echo "Copying the CRD into charts/student-controller/crds"
rm -rf "${ROOT}/charts/student-controller/crds"
mkdir -p "${ROOT}/charts/student-controller/crds"
cp "${ROOT}/config/crd/bases/"*.yaml "${ROOT}/charts/student-controller/crds/"
