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

// SweepBound is the most rows without a Student that one sweep lets go of, out of the
// rows the owner holds: most, and percent of them (at least one). Past it, a sweep
// lets none go: so many looks like a fault, not deletions.
func SweepBound(most, percent, rows int) int {
	return min(most, max(1, rows*percent/100))
}
