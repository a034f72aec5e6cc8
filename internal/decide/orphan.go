package decide

import (
	"fmt"

	"github.com/student-controller/student-controller/internal/registry"
)

// WithoutStudent is the decision for a row whose Student is not in this cluster,
// which the sweep, plan and adopt share: whether the sweep releases it, and whether
// adopt may make a Student of it (else why not). Absence never destroys a row: the
// sweep releases the owner's managed rows as they stand, whatever policy they record,
// and only student-controller registry prune deletes those that recorded Delete.
// Adopt takes any row but another owner's.
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
// Student that names it (nil: none does). A paused or deleting Student's row is left
// as it is. An observed Student is queued when its row drifted: its sync reports
// that, and writes nothing.
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
	// SweepPastBound: more orphans than the bound. So many looks like a fault (a
	// wrong cluster, a deleted CRD, a cache that lost its Students), not deletions.
	SweepPastBound
	// SweepRegistryBehind: the registry went back in time and no operator has
	// confirmed it: its rows without Students may be rows the cluster let go of since.
	SweepRegistryBehind
)

// SweepHolds decides whether a sweep that found orphans, of the rows the owner holds,
// lets go of them.
func SweepHolds(orphans, bound int, registryBehind bool) SweepHold {
	switch {
	case orphans > bound:
		return SweepPastBound
	case orphans > 0 && registryBehind:
		return SweepRegistryBehind
	}
	return SweepLetsGo
}

// SweepBound is the most rows without a Student that one sweep lets go of, out of the
// rows the owner holds: most, and percent of them (at least one).
func SweepBound(most, percent, rows int) int {
	return min(most, max(1, rows*percent/100))
}
