#!/usr/bin/env bash
# -only N=10000 run of student-controller with pprof; a 30 s CPU profile from when it answers.
set -u
export GOTOOLCHAIN=go1.26.10
label=$1
cd /work/main
log=/work/ab/s19/$label.log
bin/bench -n 10000 -only student-controller -flags=--pprof-bind-address=127.0.0.1:6060 > "$log" 2>&1 &
pid=$!
until curl -sf -o /dev/null http://127.0.0.1:6060/debug/pprof/; do
  kill -0 $pid 2>/dev/null || { echo "bench exited"; exit 1; }
  sleep 0.2
done
echo "pprof up $(date -u +%T)"
curl -s -o /work/ab/s19/$label.cpu "http://127.0.0.1:6060/debug/pprof/profile?seconds=30"
curl -s -o /work/ab/s19/$label.allocs "http://127.0.0.1:6060/debug/pprof/allocs"
until grep -q "machine had\|no reading of the machine\|converged false" "$log"; do sleep 2; done
grep "converged\|machine had" "$log"
kill -TERM $pid; wait $pid
