#!/usr/bin/env bash
# Uninstalls student-controller in the order that leaves nothing stuck, on the cluster
# that kubectl reaches (KUBECONFIG, the current context), touching only what the
# installation manages:
#
#   hack/uninstall.sh [--yes] kustomize [DIR]          # what `kubectl apply -k DIR` installed (config/default)
#   hack/uninstall.sh [--yes] helm RELEASE NAMESPACE   # a Helm release (HELM names the helm binary)
#
# It first shows the context and API server it will act on and which Students it will
# delete, and asks; --yes (or UNINSTALL_YES=1) skips the question.
#
# 1. The Students the installation's controller manages are deleted while it still
#    runs: those of its --namespace (one or several) and --selector when it has them,
#    else every Student (paused ones are unpaused first: their deletion would wait).
#    It deletes each
#    row of a Student with deletionPolicy Delete and releases (keeps, no longer owned)
#    each row of one with Orphan, then lets the Student go. Set deletionPolicy: Orphan
#    first on the Students whose rows you want kept.
# 2. The CRD stays: deleting it deletes every Student of every installation. A
#    controller still running then releases their rows (kept, no longer owned; the
#    Delete ones with cause crd-deleted, which `student-controller registry prune`
#    deletes when asked); with none running, the Students stay Terminating. Delete it
#    by hand (kubectl delete crd students.bolingcavalry.k8s.io) only once no Student
#    is left and no controller runs anywhere in the cluster.
# 3. The controller and the rest are deleted, but for the registry: the SQLite file's
#    PersistentVolumeClaim stays, with the rows it keeps; delete it yourself once they
#    are no longer wanted. With kustomize the claim and its namespace are config/registry,
#    which config/default does not hold (and were DIR to hold a claim or a namespace,
#    this leaves them too); `kubectl delete -k config/registry` deletes them. The
#    chart's claim is kept by Helm: helm.sh/resource-policy: keep. What the controller
#    made as it ran stays too: its Lease (with leader election) and the registry's mark
#    in the ConfigMap LEASE-registry-mark (docs/uninstall.md says when to delete them).
#
# Deleting everything at once (kubectl delete -k) can remove the controller before its
# Students: each keeps its finalizer, Terminating, and so do the CRD and the namespaces
# that hold them. Step 1 fails after UNINSTALL_TIMEOUT (5m, per namespace of the scope)
# if the controller is not running; docs/uninstall.md says how to finish then.
set -o errexit -o nounset -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CRD="students.bolingcavalry.k8s.io"
TIMEOUT="${UNINSTALL_TIMEOUT:-5m}"
yes="${UNINSTALL_YES:-}"

usage() {
	echo "usage: $0 [--yes] kustomize [DIR] | $0 [--yes] helm RELEASE NAMESPACE" >&2
	exit 2
}
if [[ "${1:-}" == "--yes" ]]; then
	yes=1
	shift
fi
mode="${1:-}"
case "${mode}" in
kustomize)
	dir="${2:-${ROOT}/config/default}"
	manifests="$(kubectl kustomize "${dir}")"
	;;
helm)
	[[ $# -eq 3 ]] || usage
	release="$2" namespace="$3"
	manifests="$("${HELM:-helm}" get manifest "${release}" --namespace "${namespace}")"
	;;
*) usage ;;
esac

# The Students the installation's controller watches, from its manifests: the values
# of its --namespace (names separated by commas) and --selector flags; every namespace,
# every label when it has none.
namespaces="$(grep -oE -- '- "?--?namespace[= ][^" ]+' <<<"${manifests}" | head -n1 | sed -E 's/^- "?--?namespace[= ]//' || true)"
selector="$(grep -E -- '^[[:space:]]*- "?--?selector[= ]' <<<"${manifests}" | head -n1 |
	sed -E 's/^[[:space:]]*- "?--?selector[= ]//; s/"[[:space:]]*$//' || true)"
# A flag there in a form not read above (its value as the next argument, say) would
# widen the deletion to every Student: stop instead.
mentions() { grep -cE -- "(^|[^[:alnum:]-])--?$1([^[:alnum:]-]|\$)" <<<"${manifests}" || true; }
if [[ "$(mentions namespace)" -gt 0 && -z "${namespaces}" ]] || [[ "$(mentions selector)" -gt 0 && -z "${selector}" ]]; then
	echo "uninstall: the installation's controller has a --namespace or --selector flag in a form this script cannot read" >&2
	echo "(write it as --namespace=NAMES and --selector=SELECTOR); nothing done" >&2
	exit 1
fi
if [[ -n "${selector}" ]]; then
	pick=(--selector "${selector}") labels=" labeled ${selector}"
else
	pick=() labels=""
fi
if [[ -n "${namespaces}" ]]; then
	IFS=, read -r -a scopes <<<"${namespaces}"
	if [[ ${#scopes[@]} -gt 1 ]]; then
		where="namespaces ${namespaces//,/, }"
	else
		where="namespace ${namespaces}"
	fi
	what="the Students${labels} of ${where}, which this installation's controller watches"
else
	scopes=("")
	what="every Student${labels} in the cluster (this installation's controller watches every namespace)"
fi

# in_scope runs kubectl with its arguments once per namespace of the scope (once over
# every namespace when it has none); it fails when any run failed.
in_scope() {
	local ns rc=0
	for ns in "${scopes[@]}"; do
		if [[ -n "${ns}" ]]; then
			kubectl "$@" --namespace "${ns}" || rc=$?
		else
			kubectl "$@" --all-namespaces || rc=$?
		fi
	done
	return "${rc}"
}

# crd_exists says whether the CRD is there; any answer but yes or NotFound stops the
# script, so that an error is never taken for a CRD that is gone.
crd_exists() {
	local out
	if out="$(kubectl get crd "${CRD}" -o name 2>&1)"; then
		return 0
	fi
	if grep -q NotFound <<<"${out}"; then
		return 1
	fi
	echo "uninstall: cannot tell whether the CRD ${CRD} exists: ${out}" >&2
	exit 1
}

context="$(kubectl config current-context 2>/dev/null || echo '(none)')"
server="$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}' 2>/dev/null || echo '(unknown)')"
count=0
if crd_exists; then
	count="$(in_scope get "${CRD}" "${pick[@]}" -o name | wc -l | tr -d ' ')"
fi
echo "uninstall: context ${context}, API server ${server}"
echo "uninstall: will delete ${what}: ${count} now, then the ${mode} installation"
if [[ -z "${yes}" ]]; then
	if [[ ! -t 0 ]]; then
		echo "uninstall: not a terminal, and --yes not given: nothing done" >&2
		exit 2
	fi
	read -r -p "Go ahead? [y/N] " answer
	[[ "${answer}" == y || "${answer}" == Y || "${answer}" == yes ]] || {
		echo "uninstall: nothing done"
		exit 1
	}
fi

if crd_exists; then
	# A paused Student's deletion waits until it is unpaused: unpause them first. Each
	# then has its row written from its spec again before it is deleted or released.
	in_scope get "${CRD}" "${pick[@]}" --no-headers \
		-o custom-columns='NAMESPACE:.metadata.namespace,NAME:.metadata.name,PAUSED:.metadata.annotations.bolingcavalry\.k8s\.io/paused' |
		while read -r ns name paused; do
			if [[ "${paused}" == true ]]; then
				echo "uninstall: unpausing Student ${ns}/${name}, whose deletion would wait otherwise"
				kubectl annotate "${CRD}" "${name}" --namespace "${ns}" bolingcavalry.k8s.io/paused- >/dev/null
			fi
		done
	echo "uninstall: deleting ${what}; the controller deletes or releases each row, per its deletionPolicy"
	if [[ -z "${selector}" ]]; then
		pick=(--all) # delete takes --all or a selector
	fi
	if ! in_scope delete "${CRD}" "${pick[@]}" --wait --timeout="${TIMEOUT}"; then
		echo >&2
		echo "uninstall: Students are still Terminating after ${TIMEOUT}: they wait for the controller" >&2
		echo "to deal with their rows. Is it running? If it is gone, run it again (docs/uninstall.md)," >&2
		echo "then run this again. Nothing else was deleted." >&2
		exit 1
	fi
	left="$(kubectl get "${CRD}" --all-namespaces -o name | wc -l | tr -d ' ')"
	if [[ "${left}" -eq 0 ]]; then
		echo "uninstall: the CRD ${CRD} stays; no Student is left. Deleting it deletes every Student any"
		echo "uninstall: installation adds later: kubectl delete crd ${CRD}, once no controller runs"
	else
		echo "uninstall: ${left} Students outside this installation's scope remain: the CRD ${CRD} stays"
	fi
fi

case "${mode}" in
kustomize)
	# Everything but a CRD (were DIR to hold one: step 2) and the registry's claim and
	# the namespace that holds it.
	echo "uninstall: deleting what ${dir} installed, but the CRD, the registry's PersistentVolumeClaim and its namespace"
	awk 'BEGIN { RS = "\n---\n"; ORS = "\n---\n" } !/(^|\n)kind: (CustomResourceDefinition|PersistentVolumeClaim|Namespace)\n/' <<<"${manifests}" |
		kubectl delete -f - --ignore-not-found --wait --timeout="${TIMEOUT}"
	awk 'BEGIN { RS = "\n---\n" } /(^|\n)kind: PersistentVolumeClaim\n/' <<<"${manifests}" | grep -E '^  (name|namespace):' | paste -sd' ' |
		sed -E 's/^/uninstall: kept, with the rows it holds: PersistentVolumeClaim /' || true
	echo "uninstall: left as they are: the namespace and the SQLite registry's claim with its rows (config/namespace,"
	echo "uninstall: config/registry); kubectl delete -k config/registry deletes them once the rows are no longer wanted"
	;;
helm)
	echo "uninstall: helm uninstall ${release}"
	"${HELM:-helm}" uninstall "${release}" --namespace "${namespace}" --wait --timeout="${TIMEOUT}"
	;;
esac
echo "uninstall: done"
