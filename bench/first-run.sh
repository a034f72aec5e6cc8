#!/usr/bin/env bash
# Measures a newcomer's first `make run` of a commit on this machine: a fresh clone, empty
# Go module and build caches and no GOTOOLCHAIN set (the toolchain the Makefile pins is
# downloaded too), until make run prints that the controller is running; then Ctrl-C, and
# everything it made is removed. Prints the seconds, and each step's line with the second
# it was printed at. Nothing else should run meanwhile: it measures the machine's cores.
#
#   bench/first-run.sh [COMMIT]    (HEAD by default)
set -o errexit -o nounset -o pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
rev="$(git -C "${root}" rev-parse "${1:-HEAD}")"
dir="$(mktemp -d "${TMPDIR:-/tmp}/first-run.XXXXXX")"
cleanup() {
	[[ -n "${pid:-}" ]] && kill -KILL -- "-${pid}" 2>/dev/null || true
	chmod -R u+w "${dir}" 2>/dev/null || true
	rm -rf "${dir}"
}
trap cleanup EXIT
git clone --quiet "${root}" "${dir}/src"
git -C "${dir}/src" checkout --quiet "${rev}"
export GOMODCACHE="${dir}/mod" GOCACHE="${dir}/cache" GOPATH="${dir}/gopath" GOFLAGS=-modcacherw
unset GOTOOLCHAIN
cd "${dir}/src"
log="${dir}/run.log"
start=$(date +%s)
# make run in a session of its own, as a terminal runs a foreground job, so that the
# Ctrl-C below reaches it alone; its lines are stamped with the seconds since the start
# by a reader outside that session.
setsid make run STATE_DIR="${dir}/state" > >(while IFS= read -r line; do
	printf '%4d %s\n' $(($(date +%s) - start)) "${line}"
done > "${log}") 2>&1 &
pid=$!
until grep -q 'student-controller is running' "${log}" 2>/dev/null; do
	if ! kill -0 "${pid}" 2>/dev/null; then
		echo "make run ended before it was up:" >&2
		tail -n 30 "${log}" >&2
		exit 1
	fi
	if (($(date +%s) - start > 3600)); then
		echo "make run was not up within an hour" >&2
		exit 1
	fi
	sleep 1
done
up=$(($(date +%s) - start))
kill -INT -- "-${pid}"
wait "${pid}" || true
sleep 1 # the reader's last lines
if kill -0 -- "-${pid}" 2>/dev/null; then
	echo "make run left processes behind after Ctrl-C (killed now):" >&2
	ps -o pid,args -g "${pid}" >&2 || true
	kill -KILL -- "-${pid}" 2>/dev/null || true
fi
pid=""
echo "first make run of ${rev:0:7}: up after ${up} s on $(nproc) cores"
grep -E '==>|built in|compiling|go build|up to date' "${log}" | grep -v 'go: downloading' || true
