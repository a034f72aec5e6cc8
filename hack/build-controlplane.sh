#!/usr/bin/env bash
# Builds the local control plane (etcd, kube-apiserver and kube-controller-manager) from
# their Go modules into bin/k8s, the binaries that the tests, the bench and `make run` start. It rebuilds only when the
# binaries are missing or the inputs that made them changed.
set -o errexit -o nounset -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="${ROOT}/hack/tools/controlplane"
OUT="${ROOT}/bin/k8s"
KUBE_VERSION="v1.37.2"

# Everything that decides what the binaries are: change any of it and they are rebuilt.
stamp="$(cat "${TOOLS}/go.mod" "${TOOLS}/go.sum" "${TOOLS}/etcd/main.go" "${BASH_SOURCE[0]}" \
	| sha256sum | cut -d' ' -f1) $(go env GOVERSION)"
if [[ -x "${OUT}/kube-apiserver" && -x "${OUT}/kube-controller-manager" && -x "${OUT}/etcd" && -f "${OUT}/.stamp" \
	&& "$(cat "${OUT}/.stamp")" == "${stamp}" ]]; then
	echo "control plane: up to date in ${OUT#"${ROOT}"/}"
	exit 0
fi

mkdir -p "${OUT}"
rm -f "${OUT}/.stamp"
log="${OUT}/build.log"
echo "control plane: building etcd, kube-apiserver and kube-controller-manager ${KUBE_VERSION} from Go modules into ${OUT#"${ROOT}"/}"
echo "control plane: the first build takes minutes (about 6 to 10 on 2 cores); later runs reuse it"

# The version the API server reports (kubectl version, /version) is stamped at link
# time, as Kubernetes' own build does; otherwise it says v0.0.0-master.
minor="${KUBE_VERSION#v1.}"
minor="${minor%%.*}"
ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags+=" -X ${pkg}.gitVersion=${KUBE_VERSION} -X ${pkg}.gitMajor=1 -X ${pkg}.gitMinor=${minor}"
	ldflags+=" -X ${pkg}.gitTreeState=clean -X ${pkg}.buildDate=1970-01-01T00:00:00Z"
done

start=${SECONDS}
build() { # name, package
	echo "control plane: compiling $1 ..."
	# -v lists each package as it is compiled; show a running count instead of thousands
	# of lines, and keep the full log for when something fails.
	if ! (cd "${TOOLS}" && CGO_ENABLED=0 go build -v -ldflags "${ldflags}" -o "${OUT}/$1" "$2") 2>&1 \
		| tee "${log}" \
		| awk -v name="$1" -v start="${start}" '
			{ n++ }
			n % 250 == 0 { printf "control plane:   %s: %d packages compiled\n", name, n; fflush() }'; then
		echo "control plane: building $1 failed; the last lines of ${log}:" >&2
		tail -n 30 "${log}" >&2
		exit 1
	fi
}
build etcd ./etcd
build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver
build kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager

echo "${stamp}" > "${OUT}/.stamp"
rm -f "${log}"
echo "control plane: built in $((SECONDS - start))s: $("${OUT}/kube-apiserver" --version), kube-controller-manager $("${OUT}/kube-controller-manager" --version | awk '{print $2}'), etcd $("${OUT}/etcd" --version | head -n1 | awk '{print $3}')"
