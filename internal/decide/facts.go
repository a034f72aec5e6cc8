package decide

import (
	"fmt"
	"time"

	"github.com/student-controller/student-controller/internal/registry"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// Facts are what is known of one Student; a fact not yet known is asked (Decision.Ask).
type Facts struct {
	// Owner marks the rows this controller writes.
	Owner   string
	Student Student
	Row     Row
	// Quorum: a quorum read of the Student, asked before undoing production's past.
	Quorum Quorum
	// History says what became of a missing row; Deleted is its last entry if a delete.
	History History
	Deleted registry.HistoryEntry
	// CRD: whether the CRD is being deleted, asked before a finalizer deletes a row.
	// CRDOlder: the served CRD lacks fields this controller writes, per watch or Student.
	CRD      CRD
	CRDOlder bool
	// RegistryBehind: the registry is behind the cluster's mark and no operator confirmed
	// it, or the marks are not compared yet.
	RegistryBehind bool
	// UndoLeft: the bound on rows undone (MaxUndo, --registry-max-rewinds) has room left.
	UndoLeft bool
	MaxUndo  int
}

// Student is what the decision reads of a Student.
type Student struct {
	Namespace, Name, UID string
	Generation           int64
	Spec                 studentv1.StudentSpec
	// RowKey is the uid of its row: its row-uid annotation, or its own uid.
	RowKey string
	// Deleting: its deletion timestamp is set. Finalizer: it carries the controller's.
	Deleting, Finalizer bool
	Paused              bool
	// Written: its status says a row was written. Drifted: that the observed row differs.
	Written, Drifted bool
}

// NamesRow says whether the Student names a row not keyed by its uid (one adopt bound).
func (s Student) NamesRow() bool { return s.RowKey != s.UID }

// Observed says whether the Student only observes its row.
func (s Student) Observed() bool { return s.Spec.Management == studentv1.ManagementObserve }

// Policy is the Student's deletion policy, Delete when unset.
func (s Student) Policy() studentv1.DeletionPolicy { return SpecPolicy(s.Spec) }

// Read is what reading the Student's row found.
type Read int

const (
	Unread Read = iota
	Absent
	// Malformed: a row the registry cannot decode.
	Malformed
	Found
)

// Row is what is known of the Student's row.
type Row struct {
	Read   Read
	Record registry.Record
	// Exists: an insert found a row. Stale: a newer row refused a write. Both ask a read.
	Exists, Stale bool
	// Refused: why the registry refused a write as not this owner's; "" if it did not.
	Refused string
}

// Quorum is what a quorum read of the Student says.
type Quorum int

const (
	QuorumUnasked Quorum = iota
	QuorumCurrent
	// QuorumGone: it has no such Student (or another of that name): the cache is behind.
	QuorumGone
	// QuorumChanged: it holds a newer version, which the watch brings.
	QuorumChanged
)

// History is what the registry's history says of a missing row.
type History int

const (
	HistoryUnasked History = iota
	// HistoryDeleted: its last history row is a delete (a finalizer of this Student ran).
	HistoryDeleted
	// HistoryOwned: its last history row is this owner's write, not a delete.
	HistoryOwned
	HistoryOther
)

// HistoryOf is the History, for owner, of a row's last history entry (ok: there is one).
func HistoryOf(owner string, last registry.HistoryEntry, ok bool) History {
	switch {
	case ok && last.Action == registry.ActionDeleted:
		return HistoryDeleted
	case ok && last.Owner == owner:
		return HistoryOwned
	}
	return HistoryOther
}

// CRD is the state of the Student CRD that the API server serves.
type CRD int

const (
	CRDUnasked CRD = iota
	CRDCurrent
	// CRDDeleting: it is being deleted, and its Students with it, not by their users.
	CRDDeleting
)

// Want is the row a Student should have, written by owner.
func Want(owner string, s Student) registry.Record {
	studentUID := ""
	if s.NamesRow() {
		studentUID = s.UID
	}
	return registry.Record{
		UID: s.RowKey, StudentUID: studentUID, Namespace: s.Namespace, Name: s.Name,
		StudentName: s.Spec.Name, School: s.Spec.School, Owner: owner, Generation: s.Generation,
		DeletionPolicy: string(SpecPolicy(s.Spec)), Management: RowManagement(s.Spec),
	}
}

// RowManagement is the management a row records for spec.
func RowManagement(spec studentv1.StudentSpec) string {
	if spec.Management == studentv1.ManagementObserve {
		return registry.ManagementObserve
	}
	return ""
}

// SpecPolicy is spec's deletion policy, Delete when unset.
func SpecPolicy(spec studentv1.StudentSpec) studentv1.DeletionPolicy {
	if spec.DeletionPolicy == "" {
		return studentv1.DeletionPolicyDelete
	}
	return spec.DeletionPolicy
}

// SameRow says whether a stored row already holds what want would write.
func SameRow(row, want registry.Record) bool {
	return row.UID == want.UID && row.Namespace == want.Namespace && row.Name == want.Name &&
		row.StudentName == want.StudentName && row.School == want.School &&
		row.Owner == want.Owner && row.Generation == want.Generation && row.DeletionPolicy == want.DeletionPolicy &&
		row.Management == want.Management
}

// TakenBack says whether a live Student takes back row: owner released it, and no one has
// taken or observed it since.
func TakenBack(row registry.Record, owner string) bool {
	return row.Owner == "" && row.ReleasedBy == owner && row.Management == ""
}

// OwnedBy says whose row is, for messages.
func OwnedBy(r registry.Record) string {
	if r.Owner == "" {
		return "released"
	}
	return fmt.Sprintf("owned by %q", r.Owner)
}

// stamp is how the messages write a time.
func stamp(t time.Time) string { return t.Format(time.RFC3339) }
