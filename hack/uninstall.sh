#!/usr/bin/env bash
# Uninstalls student-controller in the order that leaves nothing stuck, on the cluster
# that kubectl reaches (KUBECONFIG, the current context):
#
#   hack/uninstall.sh kustomize [DIR]          # what `kubectl apply -k DIR` installed (config/default)
#   hack/uninstall.sh helm RELEASE NAMESPACE   # a Helm release (HELM names the helm binary)
#
# 1. Every Student is deleted while the controller still runs: it deletes each row of a
#    Student with deletionPolicy Delete and releases (keeps, no longer owned) each row of
#    one with Orphan, then lets the Student go. Set deletionPolicy: Orphan first on the
#    Students whose rows you want kept.
# 2. The CRD is deleted: nothing is left in it, so it goes at once, and no Student can be
#    made meanwhile.
# 3. The controller and the rest are deleted.
#
# Deleting everything at once (kubectl delete -k) can remove the controller before its
# Students: each keeps its finalizer, Terminating, and so do the CRD and the namespaces
# that hold them. Step 1 fails after UNINSTALL_TIMEOUT (5m) if the controller is not
# running; the README's "Uninstalling" says how to finish then.
set -o errexit -o nounset -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CRD="students.bolingcavalry.k8s.io"
TIMEOUT="${UNINSTALL_TIMEOUT:-5m}"

usage() {
	echo "usage: $0 kustomize [DIR] | $0 helm RELEASE NAMESPACE" >&2
	exit 2
}
mode="${1:-}"
case "${mode}" in
kustomize) dir="${2:-${ROOT}/config/default}" ;;
helm)
	[[ $# -eq 3 ]] || usage
	release="$2" namespace="$3"
	;;
*) usage ;;
esac

if kubectl get crd "${CRD}" >/dev/null 2>&1; then
	echo "uninstall: deleting every Student; the controller deletes or releases each row, per its deletionPolicy"
	if ! kubectl delete "${CRD}" --all --all-namespaces --wait --timeout="${TIMEOUT}"; then
		echo >&2
		echo "uninstall: Students are still Terminating after ${TIMEOUT}: they wait for the controller" >&2
		echo "to deal with their rows. Is it running? If it is gone, run it again (README, Uninstalling)," >&2
		echo "then run this again. Nothing else was deleted." >&2
		exit 1
	fi
	echo "uninstall: deleting the CRD ${CRD}"
	kubectl delete crd "${CRD}" --wait --timeout="${TIMEOUT}"
fi

case "${mode}" in
kustomize)
	echo "uninstall: deleting what ${dir} installed"
	kubectl delete -k "${dir}" --ignore-not-found --wait --timeout="${TIMEOUT}"
	;;
helm)
	echo "uninstall: helm uninstall ${release}"
	"${HELM:-helm}" uninstall "${release}" --namespace "${namespace}" --wait --timeout="${TIMEOUT}"
	;;
esac
echo "uninstall: done"
