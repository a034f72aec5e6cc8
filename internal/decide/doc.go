// Package decide holds the rules for a Student's registry row: facts in, the actions,
// the desired status and the Events out, with no I/O.
package decide
