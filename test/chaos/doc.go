// Package chaos strikes the faults a cluster has (a controller SIGKILLed mid-bulk, the
// API server stopped and killed, etcd killed, PostgreSQL killed, the leader killed or
// paused past its Lease) while a loader creates, updates and deletes Students, and then
// checks every invariant by object and by row. The harness owns every process, so that
// a fault restarts the same binary on the same data with the same certificates.
//
// `make test` runs a small schedule; `make chaos` (CHAOS_N Students) writes the results
// to chaos/results.
package chaos
