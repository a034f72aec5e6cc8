//go:build bench_nohistory

package registry

// writeHistory is false in this build: the bench's contender without the history
// (-tags bench_nohistory), built only to measure what the history costs. No build
// that ships leaves it out.
const writeHistory = false
