#!/usr/bin/env bash
# Installs the outside tools that `make lint` and the tests run into bin/tools: all of
# them, or those named (hack/install-tools.sh helm). The checkers are pinned here and
# built with `go install MODULE@VERSION`, each with the dependencies its own go.mod names
# (one shared tools module cannot hold them: their dependencies' versions differ). Helm,
# gosec and promtool are pinned by tools modules of their own in hack/tools, which hold
# the modules they share with the product at its versions (gosec runs through a small
# command over its library: gosec's own links three AI SDKs).
# A tool is rebuilt only when its version or the Go toolchain changes. Nothing comes from
# anywhere but the Go module proxy. Static and -trimpath, as the project's own builds:
# the standard library and any module version they share is compiled once.
set -o errexit -o nounset -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${ROOT}/bin/tools"
mkdir -p "${BIN}"

# name  package@version
TOOLS=(
	"staticcheck honnef.co/go/tools/cmd/staticcheck@v0.8.2"
	"govulncheck golang.org/x/vuln/cmd/govulncheck@v1.9.0"
	"kube-score github.com/zegl/kube-score/cmd/kube-score@v1.20.0"
	# make release's SBOMs; not built unless named (hack/install-tools.sh cyclonedx-gomod).
	"cyclonedx-gomod github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod@v1.10.0"
)

# By default all but make release's own.
wanted() { [[ (-z "${WANTED}" && $1 != cyclonedx-gomod) || " ${WANTED} " == *" $1 "* ]]; }
WANTED="$*"
goversion="$(go env GOVERSION)"

# up_to_date NAME VERSION: the tool is installed from VERSION with this toolchain.
up_to_date() { [[ -x "${BIN}/$1" && -f "${BIN}/.$1.version" && "$(cat "${BIN}/.$1.version")" == "$2 ${goversion}" ]]; }

# build_tool NAME VERSION-LINE COMMAND...: runs the build and records what it built.
build_tool() {
	local name="$1" version="$2" start=${SECONDS}
	shift 2
	"$@" || { echo "tools: ${name} failed to build" >&2; return 1; }
	echo "${version}" >"${BIN}/.${name}.version"
	echo "tools: ${name} built in $((SECONDS - start))s"
}

# The builds run at once: each spends part of its time downloading and linking on one
# core, which the others' compiles fill.
pids=()
for entry in "${TOOLS[@]}"; do
	read -r name pkg <<<"${entry}"
	if ! wanted "${name}" || up_to_date "${name}" "${pkg}"; then
		continue
	fi
	echo "tools: installing ${pkg} (${goversion}) ..."
	build_tool "${name}" "${pkg} ${goversion}" env GOBIN="${BIN}" CGO_ENABLED=0 go install -trimpath "${pkg}" &
	pids+=($!)
done

# module_tool NAME DIR PACKAGE [TAGS]: builds PACKAGE of the tools module DIR as
# bin/tools/NAME, with build tags TAGS, again whenever the module's files or TAGS change.
module_tool() {
	local name="$1" module="${ROOT}/$2" pkg="$3" tags="${4:-}" version
	version="$(find "${module}" -maxdepth 1 \( -name 'go.*' -o -name '*.go' \) -print0 | LC_ALL=C sort -z | xargs -0 cat | sha256sum | cut -d' ' -f1)${tags:+ tags=${tags}}"
	if wanted "${name}" && ! up_to_date "${name}" "${version}"; then
		echo "tools: installing ${name} from $2${tags:+ (tags ${tags})} (${goversion}) ..."
		(cd "${module}" && build_tool "${name}" "${version} ${goversion}" \
			env GOBIN="${BIN}" CGO_ENABLED=0 go install -trimpath ${tags:+-tags "${tags}"} "${pkg}") &
		pids+=($!)
	fi
}
module_tool helm hack/tools/helm tool
module_tool gosec hack/tools/gosec .
# promtool without Prometheus' service discoveries (remove_all_sd: the cloud SDKs);
# checking and testing rules needs none.
module_tool promtool hack/tools/promtool tool remove_all_sd

failed=0
for pid in "${pids[@]}"; do
	wait "${pid}" || failed=1
done
exit "${failed}"
