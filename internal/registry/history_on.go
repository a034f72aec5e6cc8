//go:build !bench_nohistory

package registry

// writeHistory is false only in the bench's build without the history
// (-tags bench_nohistory), which measures what the history costs; every other build
// writes a history row with each row write.
const writeHistory = true
