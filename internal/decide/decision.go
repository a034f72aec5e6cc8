package decide

import (
	"errors"

	"github.com/student-controller/student-controller/internal/registry"
)

// Ask names a fact the decision needs before it can say what to do.
type Ask int

const (
	AskNothing Ask = iota
	// AskRow: read the row (Facts.Row).
	AskRow
	// AskQuorum: read the Student from the API server with a quorum read.
	AskQuorum
	// AskHistory: read the row's last history entry.
	AskHistory
	// AskCRD: read whether the CRD is being deleted.
	AskCRD
)

// Op is one thing the controller does to the Student or its row.
type Op int

const (
	AddFinalizer Op = iota + 1
	// Insert writes a new row without reading first; an Exists answer is a fact.
	Insert
	Upsert
	// Rewind writes a row that is ahead of its Student back to it.
	Rewind
	// TakeBack owns again and writes a row this owner released for this Student.
	TakeBack
	MarkObserved
	RecordPolicy
	// Delete deletes the row if it records Delete (the SQL checks, as it does the
	// owner and the fence), and releases it otherwise.
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
	// Undo says the write undoes production's past: it takes one of the bound.
	Undo bool
}

// Result says what becomes of the Student's key once the actions are applied.
type Result int

const (
	// Done: forget the key.
	Done Result = iota
	// Terminal: retrying cannot help; a change to the Student brings it back.
	Terminal
	// Retry: the cache is behind the API server; retry with backoff.
	Retry
)

// Registry says what the status shows of the row.
type Registry int

const (
	// KeepRegistry keeps status.registry as it is.
	KeepRegistry Registry = iota
	// FromRow sets it from the row written or found.
	FromRow
)

// Status is the status a Student should have: its Ready condition and, for an
// observed Student, its Drifted condition. Paused is the paused form instead, which
// sets Synced=False and leaves Ready as it is.
type Status struct {
	Reason, Message string
	Ready           bool
	Registry        Registry
	// Drifted is set for an observed Student: whether its row differs.
	Drifted *bool
	Paused  bool
}

// Event is an Event to post once the actions are applied. OnChange posts it only
// when the status changed: once per change, not on every retry.
type Event struct {
	Warning  bool
	Reason   string
	Message  string
	OnChange bool
}

// Decision is what to do for one Student: a fact to find out first (Ask), or the
// actions in order, then the status and the Events.
type Decision struct {
	Ask     Ask
	Actions []Action
	// Status is nil when it is to stay as it is.
	Status *Status
	Events []Event
	Result Result
	// Why says why in a few words: for the log (a Terminal or Retry result) and for
	// the plan (a refusal, drift, a finalizer that lets nothing go).
	Why string
}

func (d Decision) with(a ...Action) Decision {
	d.Actions = append(d.Actions, a...)
	return d
}

func ask(a Ask) Decision { return Decision{Ask: a} }

// maxAsks bounds the facts one decision asks for: each is asked at most once.
const maxAsks = 6

// Settle decides for f, finding out each fact the decision asks for with answer
// (which sets it in f) and deciding again, until the decision asks for nothing.
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
