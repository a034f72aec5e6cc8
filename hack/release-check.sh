#!/usr/bin/env bash
# Checks what make release and make publish were given, before either builds or pushes
# anything. The Makefile passes the values in the environment (RELEASE_REGISTRY,
# RELEASE_VERSION, RELEASE_DIST, RELEASE_REVISION), never in a recipe's text, so no
# value reaches a shell as code; once checked, they hold nothing a shell reads
# specially. (The Makefile refuses a $ in them before it expands any.)
#
#   hack/release-check.sh release|publish
set -o errexit -o nounset -o pipefail

target=$1
registry=${RELEASE_REGISTRY-}
version=${RELEASE_VERSION-}
dist=${RELEASE_DIST-}
revision=${RELEASE_REVISION-}

fail() {
	echo "make $target: $*" >&2
	exit 2
}

# REGISTRY: a registry host (a DNS name or an IPv4 address, a port if any) and a
# repository path below it, as the OCI distribution spec's reference grammar has them;
# make release adds /student-controller, make publish that and /charts.
component='[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*'
label='[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?'
host="$label(\\.$label)*(:[0-9]+)?"
if [[ -z $registry ]]; then
	fail "say where the release is published, REGISTRY=host/path (the packaged chart names its image there)"
fi
if ! [[ $registry =~ ^$host(/$component)*$ ]] || ((${#registry} > 200)); then
	fail "REGISTRY=$(printf %q "$registry") is not a registry and path: host[:port]/path, lower-case path components of letters, digits and . _ - (the OCI reference grammar)"
fi

# VERSION: semantic versioning, without build metadata (an image tag has no +).
number='(0|[1-9][0-9]*)'
pre="($number|[0-9]*[A-Za-z-][0-9A-Za-z-]*)"
if ! [[ $version =~ ^$number\.$number\.$number(-$pre(\.$pre)*)?$ ]]; then
	fail "VERSION=$(printf %q "$version") is not a semantic version MAJOR.MINOR.PATCH[-PRERELEASE], e.g. 0.4.1 or 0.5.0-rc.1"
fi

# DIST: dist/ or a folder below it, which make release empties first: never .git, .local
# or any other folder of the checkout.
if ! [[ $dist =~ ^dist(/[A-Za-z0-9_-][A-Za-z0-9._-]*)*/?$ ]] || [[ $dist == *..* ]]; then
	fail "DIST=$(printf %q "$dist"): dist or a folder below it, please (make release empties it first)"
fi

# REVISION: the commit the binaries and the image name.
if ! [[ $revision =~ ^[0-9a-f]{40}$ ]]; then
	fail "REVISION=$(printf %q "$revision") is not a commit hash (git rev-parse HEAD)"
fi

# A release is built from a commit, and its binaries name it: nothing changed, nothing
# new beside it (go build would compile a new file of a package in).
if [[ $target == release ]]; then
	if ! git diff --quiet HEAD -- || [[ -n $(git status --porcelain --untracked-files=normal) ]]; then
		git status --short >&2
		fail "the tree has changes (above); commit or stash them, a release is built from a commit"
	fi
fi
