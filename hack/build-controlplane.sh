#!/usr/bin/env bash
# Builds the local control plane (etcd, kube-apiserver and kube-controller-manager) from
# their Go modules into bin/k8s, the binaries that the tests, the bench and `make run` start.
# With the argument `node` it builds the node's binaries instead (kube-scheduler, kubelet and
# kube-proxy, for `make cluster` and the node suite). It rebuilds only when the binaries are
# missing or the inputs that made them changed.
set -o errexit -o nounset -o pipefail

set_name="control plane"
binaries=(etcd kube-apiserver kube-controller-manager)
minutes="about 6 to 10"
if [[ "${1:-}" == node ]]; then
	set_name="node"
	binaries=(kube-scheduler kubelet kube-proxy)
	minutes="about 4 to 6 more"
fi

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="${ROOT}/hack/tools/controlplane"
OUT="${ROOT}/bin/k8s"
KUBE_VERSION="v1.37.2"

# Everything that decides what the binaries are: change any of it and they are rebuilt.
stamp="$(cat "${TOOLS}/go.mod" "${TOOLS}/go.sum" "${TOOLS}/etcd/main.go" "${BASH_SOURCE[0]}" <(grep "^GO_TAGS :=" "${ROOT}/Makefile") \
	| sha256sum | cut -d' ' -f1) $(go env GOVERSION)"
stamp_file="${OUT}/.stamp-${set_name// /-}"
up_to_date=true
for b in "${binaries[@]}"; do
	[[ -x "${OUT}/${b}" ]] || up_to_date=false
done
if [[ "${up_to_date}" == true && -f "${stamp_file}" && "$(cat "${stamp_file}")" == "${stamp}" ]]; then
	echo "${set_name}: up to date in ${OUT#"${ROOT}"/}"
	exit 0
fi

mkdir -p "${OUT}"
rm -f "${stamp_file}"
log="${OUT}/build.log"
echo "${set_name}: building ${binaries[*]} ${KUBE_VERSION} from Go modules into ${OUT#"${ROOT}"/}"
echo "${set_name}: the first build takes minutes (${minutes} on 2 cores); later runs reuse it"

# The version the API server reports (kubectl version, /version) is stamped at link
# time, as Kubernetes' own build does; otherwise it says v0.0.0-master.
minor="${KUBE_VERSION#v1.}"
minor="${minor%%.*}"
ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags+=" -X ${pkg}.gitVersion=${KUBE_VERSION} -X ${pkg}.gitMajor=1 -X ${pkg}.gitMinor=${minor}"
	ldflags+=" -X ${pkg}.gitTreeState=clean -X ${pkg}.buildDate=1970-01-01T00:00:00Z"
done

# One go build for the three binaries, so that the packages they share are compiled
# once and one links while the others compile; with the flags and tags of the
# controller's own build (make build: -trimpath, CGO_ENABLED=0, GO_TAGS) and the same
# versions of the modules both use (hack/tools/controlplane/go.mod follows go.mod), so
# that the controller's build then finds client-go, apimachinery, grpc and the rest
# compiled. -s -w: no symbol table or DWARF, which only a debugger would read, and
# which make each link slower.
tags="$(sed -n 's/^GO_TAGS := //p' "${ROOT}/Makefile")"
packages=()
for b in "${binaries[@]}"; do
	if [[ "${b}" == etcd ]]; then
		packages+=(./etcd)
	else
		packages+=("k8s.io/kubernetes/cmd/${b}")
	fi
done
start=${SECONDS}
echo "${set_name}: compiling ${binaries[*]} ..."
# -v lists each package as it is compiled; show a running count instead of thousands of
# lines, and keep the full log for when something fails.
if ! (cd "${TOOLS}" && CGO_ENABLED=0 go build -v -trimpath -tags "${tags}" -ldflags "-s -w ${ldflags}" -o "${OUT}/" "${packages[@]}") 2>&1 \
	| tee "${log}" \
	| awk -v set="${set_name}" '
		{ n++ }
		n % 250 == 0 { printf "%s:   %d packages compiled\n", set, n; fflush() }'; then
	echo "${set_name}: building ${binaries[*]} failed; the last lines of ${log}:" >&2
	tail -n 30 "${log}" >&2
	exit 1
fi

echo "${stamp}" > "${stamp_file}"
rm -f "${log}"
if [[ "${set_name}" == node ]]; then
	echo "node: built in $((SECONDS - start))s: $("${OUT}/kubelet" --version), kube-scheduler and kube-proxy of the same release"
else
	echo "control plane: built in $((SECONDS - start))s: $("${OUT}/kube-apiserver" --version), kube-controller-manager $("${OUT}/kube-controller-manager" --version | awk '{print $2}'), etcd $("${OUT}/etcd" --version | head -n1 | awk '{print $3}')"
fi
