#!/usr/bin/env bash
# Alternating -only N = 10000 runs: the build before (7aea4f5, in /tmp/base, with the
# bench's CPU line added), this change (/work/main), and the status-only floor; each
# stopped once its CPU line is out.
set -u
export GOTOOLCHAIN=go1.26.10
one() { # root contender label
	local log=/work/ab/s19/pairs/$3.log
	echo "== $3 start $(date -u +%T)"
	(cd "$1" && exec bin/bench -n 10000 -only "$2") > "$log" 2>&1 &
	local pid=$!
	until grep -q "s of CPU to converge\|converged false" "$log" 2>/dev/null; do
		if ! kill -0 "$pid" 2>/dev/null; then echo "bench exited early"; break; fi
		sleep 2
	done
	grep "converged\|machine had\|CPU to converge" "$log"
	kill -TERM "$pid" 2>/dev/null
	wait "$pid"
}
for i in $(seq 1 "${1:-4}"); do
	one /tmp/base student-controller base-$i
	one /work/main student-controller new-$i
	one /work/main floor-status-only floor-$i
done
echo "== all done $(date -u +%T)"

# Then one -only run each at N = 30000 (new first), the same way: n30k-new-1, n30k-base-1.
