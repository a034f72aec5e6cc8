#!/usr/bin/env bash
# Paired A/B of SQLite's synchronous mode at N = 100000, -only student-controller, stopped once converged.
set -u
export GOTOOLCHAIN=go1.26.10
one() { # tree label
	local log=/work/ab/$2.log
	echo "== $2 start $(date -u +%T)"
	(cd "$1" && exec bin/bench -n 100000 -only student-controller) > "${log}" 2>&1 &
	local pid=$!
	until grep -q "converged true after\|converged false" "${log}" 2>/dev/null; do
		if ! kill -0 "${pid}" 2>/dev/null; then echo "bench exited early"; break; fi
		sleep 2
	done
	grep "converged" "${log}" | head -2
	kill -TERM "${pid}" 2>/dev/null
	wait "${pid}"
	echo "== $2 end $(date -u +%T) rc=$?"
}
one /work/main full-1
one /tmp/normal normal-1
one /work/main full-2
one /tmp/normal normal-2
echo "== all done $(date -u +%T)"
