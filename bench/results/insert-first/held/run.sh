#!/usr/bin/env bash
# -only N = 10000 run held after its steady memory: /proc status, Go's memory stats, heap profile.
set -u
export GOTOOLCHAIN=go1.26.10
root=$1; label=$2
log=/work/ab/s19/diag-$label.log
(cd "$root" && exec bin/bench -n 10000 -only student-controller ${PPROF:+-flags=--pprof-bind-address=127.0.0.1:6060} -hold 40s) > "$log" 2>&1 &
pid=$!
until grep -q "holding" "$log" 2>/dev/null; do kill -0 $pid 2>/dev/null || { echo exited; exit 1; }; sleep 1; done
cpid=$(grep -o 'pid [0-9]*' "$log" | head -1 | cut -d' ' -f2)
murl=$(grep -o 'metrics http://[^ ]*' "$log" | head -1 | cut -d' ' -f2)
grep -E 'VmRSS|RssAnon|RssFile|RssShmem' /proc/$cpid/status > /work/ab/s19/diag-$label.status
curl -s "$murl" | grep -E '^go_memstats_(heap_inuse|heap_idle|heap_released|sys|heap_alloc|stack_inuse|mspan|other)_bytes|^go_gc_gogc' > /work/ab/s19/diag-$label.mem
[ -n "${PPROF:-}" ] && curl -s -o /work/ab/s19/diag-$label.heap http://127.0.0.1:6060/debug/pprof/heap
cat /work/ab/s19/diag-$label.status /work/ab/s19/diag-$label.mem
grep "CPU to converge" "$log"
kill -TERM $pid; wait $pid
