#!/usr/bin/env bash
# Builds the local control plane (etcd, kube-apiserver and kube-controller-manager) from
# their Go modules into bin/k8s, the binaries that the tests, the bench and `make run` start.
# With the argument `node` it builds the node's binaries instead (kube-scheduler, kubelet and
# kube-proxy, for `make cluster` and the node suite); with binary names, those alone
# (`make run` builds etcd and kube-apiserver first, and student-dev kube-controller-manager
# while the rest starts). It rebuilds a binary only when it is missing or the inputs that
# made it changed.
set -o errexit -o nounset -o pipefail

set_name="control plane"
wanted=(etcd kube-apiserver kube-controller-manager)
minutes="about 6 to 9"
if [[ "${1:-}" == node ]]; then
	set_name="node"
	wanted=(kube-scheduler kubelet kube-proxy)
	minutes="about 2 to 4 more"
elif [[ $# -gt 0 ]]; then
	wanted=("$@")
	minutes="a few"
fi
for b in "${wanted[@]}"; do
	case "${b}" in
	etcd | kube-apiserver | kube-controller-manager | kube-scheduler | kubelet | kube-proxy) ;;
	*)
		echo "build-controlplane.sh: no binary ${b}; it builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and kube-proxy" >&2
		exit 2
		;;
	esac
done

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="${ROOT}/hack/tools/controlplane"
OUT="${ROOT}/bin/k8s"
KUBE_VERSION="v1.37.2"

# Everything that decides what the binaries are: change any of it and they are rebuilt.
# Each binary has its stamp, written once it is built.
stamp="$(cat "${TOOLS}/go.mod" "${TOOLS}/go.sum" "${TOOLS}/etcd/main.go" "${BASH_SOURCE[0]}" <(grep "^GO_TAGS :=" "${ROOT}/Makefile") \
	| sha256sum | cut -d' ' -f1) $(go env GOVERSION)"
binaries=()
for b in "${wanted[@]}"; do
	if [[ ! -x "${OUT}/${b}" || ! -f "${OUT}/.stamp-${b}" || "$(cat "${OUT}/.stamp-${b}")" != "${stamp}" ]]; then
		binaries+=("${b}")
	fi
done
if [[ ${#binaries[@]} -eq 0 ]]; then
	echo "${set_name}: ${wanted[*]} up to date in ${OUT#"${ROOT}"/}"
	exit 0
fi

mkdir -p "${OUT}"
rm -f "${OUT}/.stamp-control-plane" "${OUT}/.stamp-node" # the stamps of sets, before each binary had its own
log="${OUT}/build-${binaries[0]}.log"
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

# One go build for the binaries, so that the packages they share are compiled once and
# one links while the others compile; with the flags and tags of the controller's own
# build (make build: -trimpath, CGO_ENABLED=0, GO_TAGS) and the same versions of the
# modules both use (hack/tools/controlplane/go.mod follows go.mod), so that either
# build finds client-go, apimachinery, grpc and the rest compiled by the other. -s -w:
# no symbol table or DWARF, which only a debugger would read, and which make each link
# slower.
tags="$(sed -n 's/^GO_TAGS := //p' "${ROOT}/Makefile")"
packages=()
for b in "${binaries[@]}"; do
	if [[ "${b}" == etcd ]]; then
		packages+=(./etcd)
	else
		packages+=("k8s.io/kubernetes/cmd/${b}")
	fi
done
for b in "${binaries[@]}"; do
	rm -f "${OUT}/.stamp-${b}" # until it is built whole
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
for b in "${binaries[@]}"; do
	echo "${stamp}" > "${OUT}/.stamp-${b}"
done
rm -f "${log}"

# awk, not head, reads the version: head exits after its line, and a writer still
# printing (etcd prints four) then dies of SIGPIPE, which pipefail and errexit turn into
# this script's exit status (141), after a build that succeeded.
version() { # binary: the release it reports
	case "$1" in
	etcd)
		local v
		v="$("${OUT}/etcd" --version | awk 'NR == 1 {print $3}')" || return # fails as etcd fails
		echo "etcd ${v}"
		;;
	*) echo "$1 $("${OUT}/$1" --version | awk '{print $NF}')" ;;
	esac
}
built=()
for b in "${binaries[@]}"; do
	built+=("$(version "${b}")")
done
echo "${set_name}: built in $((SECONDS - start))s: $(IFS=,; echo "${built[*]}" | sed 's/,/, /g')"
