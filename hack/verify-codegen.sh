#!/usr/bin/env bash
# Fails when anything generated from the API types (deepcopy, clientset, listers,
# informers, apply configurations, the CRD and its copy in the chart) is stale: it regenerates into a scratch copy
# of the tree and compares. Fix a failure with hack/update-codegen.sh.
set -o errexit -o nounset -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GENERATED=(pkg/apis pkg/generated config/crd charts/student-controller/templates/crd.yaml)

scratch="$(mktemp -d)"
trap 'rm -rf "${scratch}"' EXIT

# The copy holds the working tree as it is, uncommitted changes included; build outputs
# and git metadata stay behind.
tar -C "${ROOT}" --exclude=./.git --exclude=./bin --exclude=./.local -cf - . | tar -C "${scratch}" -xf -
"${scratch}/hack/update-codegen.sh" >/dev/null

stale=0
for dir in "${GENERATED[@]}"; do
	if ! diff -Naupr "${ROOT}/${dir}" "${scratch}/${dir}"; then
		stale=1
	fi
done
if [[ ${stale} -ne 0 ]]; then
	echo >&2
	echo "Generated code is stale (the diff above turns what is checked in into what the types generate)." >&2
	echo "Run hack/update-codegen.sh and commit the result." >&2
	exit 1
fi
echo "Generated code is up to date."
