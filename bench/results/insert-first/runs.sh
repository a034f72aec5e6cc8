#!/usr/bin/env bash
# Bench runs (numbered $1 to $2; three by default) at N = 10000 of student-controller and the status-only floor (results written).
set -u
export GOTOOLCHAIN=go1.26.10
cd /work/main
for i in $(seq "${1:-1}" "${2:-3}"); do
	echo "== run-$i start $(date -u +%T)"
	bin/bench -n 10000 -contenders student-controller,floor-status-only -out bench/results/insert-first/run-$i > /work/ab/s19/n10k-run-$i.log 2>&1
	echo "rc=$?"
	grep 'converged true in\|converged false\|machine had' /work/ab/s19/n10k-run-$i.log
done
echo "== done $(date -u +%T)"
