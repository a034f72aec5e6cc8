#!/usr/bin/env bash
# Alternating -only runs of one build (b2c92a7 and later docs-only commits): the spread of
# student-controller and the status-only floor at N = 10000 (three each) and N = 100000
# (one each), each stopped once converged and the machine's CPU read.
set -u
export GOTOOLCHAIN=go1.26.10
cd /work/main
one() { # n contender label
	local log=/work/ab/rep/$3.log
	echo "== $3 start $(date -u +%T)"
	bin/bench -n "$1" -only "$2" > "${log}" 2>&1 &
	local pid=$!
	until grep -q "machine had\|no reading of the machine\|converged false" "${log}" 2>/dev/null; do
		if ! kill -0 "${pid}" 2>/dev/null; then echo "bench exited early"; break; fi
		sleep 2
	done
	grep "converged\|machine had" "${log}" | head -3
	kill -TERM "${pid}" 2>/dev/null
	wait "${pid}"
	echo "== $3 end $(date -u +%T)"
}
for i in 1 2 3; do
	one 10000 student-controller n10000-student-controller-$i
	one 10000 floor-status-only n10000-floor-status-only-$i
done
one 100000 student-controller n100000-student-controller-1
one 100000 floor-status-only n100000-floor-status-only-1
echo "== all done $(date -u +%T)"
