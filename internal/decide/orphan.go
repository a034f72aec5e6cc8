package decide

import (
	"fmt"

	"github.com/student-controller/student-controller/internal/registry"
)

// WithoutStudent decides, for sweep, plan and adopt, a row whose Student is not in this
// cluster: whether the sweep releases it, and whether adopt may take it (else why not).
// Absence never destroys a row: the sweep releases the owner's managed rows as they
// stand, whatever their policy; only registry prune deletes those that recorded Delete.
func WithoutStudent(row registry.Record, owner string) (release, adoptable bool, why string) {
	switch {
	case row.Owner != "" && row.Owner != owner:
		return false, false, fmt.Sprintf("owned by %q, another owner", row.Owner)
	case row.Owner == "", row.Management == registry.ManagementObserve:
		return false, true, "" // released or another system's; or observed: kept
	}
	return true, true, ""
}

// SweepAction is what a sweep does for one of the owner's rows.
type SweepAction int

const (
	SweepKeep SweepAction = iota
	// SweepResync queues the Student, whose sync repairs its row.
	SweepResync
	// SweepRelease releases the row as it stands: no Student names it.
	SweepRelease
)

// Sweep decides for one of owner's rows (nil: the Student has none) and the cached
// Student naming it (nil: none). A paused or deleting Student's row is left alone; an
// observed one is queued if its row drifted, for its sync to report (it writes nothing).
func Sweep(owner string, row *registry.Record, s *Student) SweepAction {
	switch {
	case row != nil && row.Owner != owner && s != nil:
		// Not its row: its sync says whose it is.
		return Sweep(owner, nil, s)
	case row != nil && row.Owner != owner:
		// Never another's.
	case s == nil:
		if release, _, _ := WithoutStudent(*row, owner); release {
			return SweepRelease
		}
	case s.Deleting || s.Paused:
	case row == nil:
		if s.Spec.Validate() == "" {
			return SweepResync
		}
	case s.Observed():
		if Drift(*row, true, false, s.Namespace, s.Name, s.Spec) != "" {
			return SweepResync
		}
	case !SameRow(*row, Want(owner, *s)):
		return SweepResync
	}
	return SweepKeep
}

// SweepHold says why a sweep lets go of none of its orphans.
type SweepHold int

const (
	SweepLetsGo SweepHold = iota
	// SweepPastBound: more orphans than the bound, which looks like a fault (a wrong
	// cluster, a deleted CRD, a cache that lost its Students), not deletions.
	SweepPastBound
	// SweepRegistryBehind: a registry gone back in time may hold rows the cluster let go.
	SweepRegistryBehind
)

// SweepHolds decides whether a sweep lets go of the orphans it found among owner's rows.
func SweepHolds(orphans, bound int, registryBehind bool) SweepHold {
	switch {
	case orphans > bound:
		return SweepPastBound
	case orphans > 0 && registryBehind:
		return SweepRegistryBehind
	}
	return SweepLetsGo
}

// SweepBound is the most orphans a sweep lets go of: percent of rows (min 1), up to most.
func SweepBound(most, percent, rows int) int {
	return min(most, max(1, rows*percent/100))
}
