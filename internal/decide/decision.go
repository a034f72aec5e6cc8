package decide

import (
	"errors"

	"github.com/student-controller/student-controller/internal/registry"
)

// Ask names a fact the decision needs first: the row, a quorum read of the Student,
// the row's last history entry, or whether the CRD is being deleted.
type Ask int

const (
	AskNothing Ask = iota
	AskRow
	AskQuorum
	AskHistory
	AskCRD
)

// Op is one thing the controller does to the Student or its row.
type Op int

const (
	AddFinalizer Op = iota + 1
	// Insert writes without reading first; a row already there comes back as Row.Exists.
	Insert
	Upsert
	// Rewind writes a row that is ahead of its Student back to it.
	Rewind
	// TakeBack owns again and writes a row this owner released for this Student.
	TakeBack
	MarkObserved
	RecordPolicy
	// Delete deletes the row if it records Delete, else releases it. The SQL checks this.
	Delete
	// Release releases the row with the given values.
	Release
	// Relinquish releases the row as it stands.
	Relinquish
	// Rebind binds the row the Student names to it again, as adopt binds a row.
	Rebind
	RemoveFinalizer
)

var opNames = map[Op]string{
	AddFinalizer: "add-finalizer", Insert: "insert", Upsert: "upsert", Rewind: "rewind", TakeBack: "take-back",
	MarkObserved: "mark-observed", RecordPolicy: "record-policy", Delete: "delete", Release: "release",
	Relinquish: "relinquish", Rebind: "rebind", RemoveFinalizer: "remove-finalizer",
}

func (o Op) String() string { return opNames[o] }

// Action is one Op with what it writes.
type Action struct {
	Op Op
	// Record is the row written (Insert, Upsert, Rewind, TakeBack, Release).
	Record registry.Record
	// Why is the history's action and cause (Cause alone for a delete or release).
	Why registry.Why
	// Ahead is the generation a rewound row held.
	Ahead int64
	// Undo: the write undoes production's past, so it uses up one of the bound.
	Undo bool
}

// Result says what becomes of the Student's key once the actions are applied.
type Result int

const (
	Done Result = iota
	// Terminal: retrying cannot help; a change to the Student brings it back.
	Terminal
	// Retry: the cache is behind the API server; retry with backoff.
	Retry
)

// Registry says whether status.registry is kept or set from the row written or found.
type Registry int

const (
	KeepRegistry Registry = iota
	FromRow
)

// Status is the status a Student should have: Ready, and Drifted if observed. Paused
// instead sets Synced=False and leaves Ready as it is.
type Status struct {
	Reason, Message string
	Ready           bool
	Registry        Registry
	// Drifted is set for an observed Student: whether its row differs.
	Drifted *bool
	Paused  bool
}

// Event is one to post after the actions; with OnChange, only when the status changed.
type Event struct {
	Warning  bool
	Reason   string
	Message  string
	OnChange bool
}

// Decision is what to do for a Student: a fact to ask first, or actions, status, Events.
type Decision struct {
	Ask     Ask
	Actions []Action
	// Status is nil to leave it as it is.
	Status *Status
	Events []Event
	Result Result
	// Why is a short reason, for the log (Terminal, Retry) and plan (refusal, drift).
	Why string
}

func (d Decision) with(a ...Action) Decision {
	d.Actions = append(d.Actions, a...)
	return d
}

func ask(a Ask) Decision { return Decision{Ask: a} }

// maxAsks bounds the facts one decision asks for: each is asked at most once.
const maxAsks = 6

// Settle decides for f, setting each asked fact in f with answer, until none is asked.
func Settle(f *Facts, answer func(Ask, *Facts) error) (Decision, error) {
	for range maxAsks {
		d := Decide(*f)
		if d.Ask == AskNothing {
			return d, nil
		}
		if err := answer(d.Ask, f); err != nil {
			return d, err
		}
	}
	return Decision{}, errors.New("the decision asked for more facts than it names")
}
