package decide

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"runtime/debug"
	"slices"
	"testing"
	"time"

	"github.com/student-controller/student-controller/internal/registry"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// The model test walks every combination of the facts about one Student, its row, the
// CRD and the bound, applies each decision to an in-memory cluster and registry (whose
// writes keep the preconditions the SQL keeps: owner, generation, policy, fence), and
// decides again, for three syncs. It checks the rules the controller promises:
//   - a row is destroyed only by the finalizer of a Delete Student whose row records
//     Delete, with its CRD not being deleted, on a registry in step with the
//     cluster's mark (absence never destroys);
//   - no row of another owner or of another system is written, but one bound again
//     (Rebind: no owner, the Student's own namespace and name, and this owner's
//     history says the row was its own);
//   - no state is stuck: within three syncs every Student is Ready, gone, or not Ready
//     with a reason that docs/troubleshooting.md gives a remedy for;
//   - what a plan says (the decision over facts read, nothing written) is what the
//     sync applies.

const (
	me     = "me"
	other  = "other"
	key    = "uid-1"
	bound  = "row-9"
	maxUnd = 1
)

// rowKind is the row's state, as the facts name it.
type rowKind int

const (
	rowAbsent rowKind = iota
	rowMalformed
	rowOurs
	rowOursObserved
	rowReleasedByUs
	rowReleasedByOther
	rowOtherOwner
	rowNoOwner // another system's: never owned
	rowKinds
)

var rowKindNames = []string{"absent", "malformed", "ours", "ours-observed", "released-by-us", "released-by-other", "other-owner", "no-owner"}

// content is how the row's values stand to the Student's.
type content int

const (
	same content = iota
	older
	drifted
	ahead
	contents
)

// binding is what the Student names: its own uid, or a row bound to it, to another
// Student, or to none.
type binding int

const (
	ownKey binding = iota
	boundHere
	boundElsewhere
	boundNowhere
	bindings
)

type state struct {
	live, finalizer, observed, paused, valid, written bool
	policy                                            studentv1.DeletionPolicy
	binding                                           binding
	row                                               rowKind
	// elsewhere: the row records another Student's namespace and name.
	elsewhere   bool
	content     content
	rowPolicy   string
	history     History // what its last history row says: HistoryOther, HistoryDeleted, HistoryOwned
	quorum      Quorum
	crdDeleting bool
	crdOlder    bool
	undoLeft    bool
	// behind: the registry is behind the cluster's mark, unconfirmed.
	behind bool
}

func (s state) String() string {
	return fmt.Sprintf("live=%v finalizer=%v observed=%v paused=%v valid=%v written=%v policy=%s binding=%d row=%s content=%d rowPolicy=%q "+
		"history=%d quorum=%d crdDeleting=%v crdOlder=%v undoLeft=%v elsewhere=%v behind=%v", s.live, s.finalizer, s.observed, s.paused, s.valid, s.written, s.policy, s.binding,
		rowKindNames[s.row], s.content, s.rowPolicy, s.history, s.quorum, s.crdDeleting, s.crdOlder, s.undoLeft, s.elsewhere, s.behind)
}

// states enumerates the whole space. A row's content and policy mean nothing when it
// is absent or unreadable, so those take one value there; its namespace and name are
// another Student's only where the Student names a row by annotation.
func states(yield func(state) bool) {
	bools := []bool{false, true}
	for _, live := range bools {
		for _, fin := range bools {
			for _, policy := range []studentv1.DeletionPolicy{studentv1.DeletionPolicyDelete, studentv1.DeletionPolicyOrphan, "Retain"} {
				for _, obs := range bools {
					for _, paused := range bools {
						for _, valid := range bools {
							for _, written := range bools {
								for b := range bindings {
									for r := range rowKinds {
										cs, ps := []content{same, older, drifted, ahead}, []string{"", registry.PolicyDelete, registry.PolicyOrphan}
										es, hs := bools, []History{HistoryOther, HistoryDeleted, HistoryOwned}
										if r == rowAbsent || r == rowMalformed {
											cs, ps = cs[:1], ps[:1]
										}
										if r != rowAbsent && b == ownKey {
											hs = hs[:1] // asked only of a missing row, or a binding lost
										}
										if r == rowAbsent || r == rowMalformed || b == ownKey {
											es = es[:1]
										}
										for _, c := range cs {
											for _, p := range ps {
												for _, e := range es {
													for _, h := range hs {
														for _, q := range []Quorum{QuorumCurrent, QuorumGone, QuorumChanged} {
															for flags := range 16 {
																crdDeleting, crdOlder, undo, behind := flags&1 != 0, flags&2 != 0, flags&4 != 0, flags&8 != 0
																if !yield(state{live, fin, obs, paused, valid, written, policy, b, r, e, c, p, h, q,
																	crdDeleting, crdOlder, undo, behind}) {
																	return
																}
															}
														}
													}
												}
											}
										}
									}
								}
							}
						}
					}
				}
			}
		}
	}
}

// world is the cluster and the registry of one Student, in memory.
type world struct {
	s                     Student
	gone                  bool // the Student is gone from the cluster
	row                   *registry.Record
	malformed             bool
	history               History // what its history's last entry says
	quorum                Quorum
	crdDeleting, crdOlder bool
	behind                bool
	undos                 int
	// status is what the Student's status says: the last decision's.
	status   *Status
	result   Result
	refusals []string
}

func newWorld(st state) *world {
	spec := studentv1.StudentSpec{Name: "张三", School: "深圳中学", DeletionPolicy: st.policy}
	if st.policy == studentv1.DeletionPolicyDelete {
		spec.DeletionPolicy = "" // the default
	}
	if st.observed {
		spec.Management = studentv1.ManagementObserve
	}
	if !st.valid {
		spec.Name = "bad\x00name"
	}
	w := &world{quorum: st.quorum, crdDeleting: st.crdDeleting, crdOlder: st.crdOlder, behind: st.behind, history: st.history, undos: maxUnd}
	if st.undoLeft {
		w.undos = 0
	}
	w.s = Student{Namespace: "ns", Name: "zhang-san", UID: key, RowKey: key, Generation: 5, Spec: spec,
		Deleting: !st.live, Finalizer: st.finalizer, Paused: st.paused, Written: st.written}
	if st.binding != ownKey {
		w.s.RowKey = bound
	}
	if st.row == rowAbsent {
		return w
	}
	rec := registry.Record{UID: w.s.RowKey, Namespace: "ns", Name: "zhang-san", StudentName: "张三", School: "深圳中学",
		Owner: me, Generation: 5, DeletionPolicy: st.rowPolicy, UpdatedAt: time.Unix(1, 0)}
	switch st.binding {
	case boundHere:
		rec.StudentUID = key
	case boundElsewhere:
		rec.StudentUID = "uid-2"
	}
	if st.elsewhere {
		rec.Name = "li-si"
	}
	switch st.content {
	case older:
		rec.Generation, rec.School = 4, "旧学校"
	case drifted:
		rec.School = "别的学校"
	case ahead:
		rec.Generation, rec.School = 6, "新学校"
	}
	switch st.row {
	case rowMalformed:
		w.malformed = true
	case rowOursObserved:
		rec.Management = registry.ManagementObserve
	case rowReleasedByUs:
		rec.Owner, rec.ReleasedBy, rec.ReleaseCause, rec.ReleasedAt = "", me, registry.CauseFinalizer, time.Unix(2, 0)
	case rowReleasedByOther:
		rec.Owner, rec.ReleasedBy, rec.ReleaseCause, rec.ReleasedAt = "", other, registry.CauseSweep, time.Unix(2, 0)
	case rowOtherOwner:
		rec.Owner = other
	case rowNoOwner:
		rec.Owner = ""
	}
	w.row = &rec
	return w
}

// facts are what a sync starts from: the Student from the cache, nothing read.
func (w *world) facts() Facts {
	return Facts{Owner: me, Student: w.s, UndoLeft: w.undos < maxUnd, MaxUndo: maxUnd, CRDOlder: w.crdOlder, RegistryBehind: w.behind}
}

// answer finds out a fact from the world, as the controller's reads do.
func (w *world) answer(a Ask, f *Facts) error {
	switch a {
	case AskRow:
		f.Row.Exists = false
		switch {
		case w.row == nil:
			f.Row.Read = Absent
		case w.malformed:
			f.Row.Read = Malformed
		default:
			f.Row.Read, f.Row.Record = Found, *w.row
		}
	case AskQuorum:
		f.Quorum = w.quorum
	case AskHistory:
		f.History = w.history
		if w.history == HistoryDeleted {
			f.Deleted = registry.HistoryEntry{Action: registry.ActionDeleted, Cause: registry.CauseFinalizer, Actor: me}
		}
	case AskCRD:
		f.CRD = CRDCurrent
		if w.crdDeleting {
			f.CRD = CRDDeleting
		}
	default:
		return fmt.Errorf("asked for %d", a)
	}
	return nil
}

// errFact is a write's answer that is a fact for the decision, not a failure.
var errFact = errors.New("a fact")

// sync is one sync of the controller over the world: it settles a decision, applies
// its actions in order, and decides again when a write's answer is a new fact. It
// returns the actions applied.
func (w *world) sync(t *testing.T, st state) []Action {
	if w.gone {
		return nil
	}
	f := w.facts()
	var applied []Action
	for range 6 {
		d, err := Settle(&f, w.answer)
		if err != nil {
			t.Fatalf("%s: %v", st, err)
		}
		settled := true
		for _, a := range d.Actions {
			if a.Undo {
				if w.undos >= maxUnd {
					f.UndoLeft = false
					settled = false
					break
				}
				w.undos++
			}
			if err := w.apply(t, st, a, &f); errors.Is(err, errFact) {
				if a.Undo {
					w.undos--
				}
				settled = false
				break
			}
			applied = append(applied, a)
		}
		if settled {
			if d.Status != nil {
				w.status = d.Status
			}
			w.result = d.Result
			if d.Result == Terminal && d.Status != nil {
				w.refusals = append(w.refusals, d.Status.Reason)
			}
			w.settle()
			return applied
		}
		f.Row.Read = Unread
	}
	t.Fatalf("%s: the sync did not settle", st)
	return nil
}

// settle is what happens between syncs: a cache behind the API server catches up.
func (w *world) settle() {
	switch w.quorum {
	case QuorumGone:
		w.gone = true // the watch brings the deletion
	case QuorumChanged:
		w.quorum = QuorumCurrent // and the newer version
	}
}

// apply makes one action's write in the world, with the preconditions the SQL keeps,
// and checks that it destroys and takes nothing it may not.
func (w *world) apply(t *testing.T, st state, a Action, f *Facts) error {
	t.Helper()
	row := w.row
	mine := row != nil && (w.malformed || row.Owner == me)
	managed := mine && (w.malformed || row.Management == "")
	refused := func() error {
		f.Row.Refused = "not this owner's"
		return errFact
	}
	write := func(rec registry.Record) {
		if row != nil && !w.malformed && row.Owner != me && !(a.Op == TakeBack && TakenBack(*row, me)) {
			t.Fatalf("%s: %s wrote a row %s", st, a.Op, OwnedBy(*row))
		}
		if row != nil {
			rec.StudentUID = row.StudentUID // a write keeps the row's binding
		}
		w.row, w.malformed = &rec, false
	}
	switch a.Op {
	case AddFinalizer:
		w.s.Finalizer, f.Student.Finalizer = true, true
	case RemoveFinalizer:
		w.s.Finalizer, f.Student.Finalizer = false, false
		w.gone = w.s.Deleting
	case Insert:
		if row != nil {
			f.Row.Exists = true
			return errFact
		}
		write(a.Record)
	case Upsert:
		switch {
		case row == nil || w.malformed:
		case row.Owner != me:
			return refused()
		case row.Generation > a.Record.Generation:
			f.Row.Stale = true
			return errFact
		}
		write(a.Record)
	case Rewind:
		if !mine || w.malformed || row.Generation != a.Ahead {
			return refused()
		}
		write(a.Record)
	case TakeBack:
		if row == nil || w.malformed || !TakenBack(*row, me) {
			return refused()
		}
		write(a.Record)
	case MarkObserved:
		if managed && !w.malformed {
			row.Management = registry.ManagementObserve
		}
	case RecordPolicy:
		if mine && !w.malformed && row.DeletionPolicy == "" {
			row.DeletionPolicy = a.Record.DeletionPolicy
		}
	case Delete, Relinquish:
		switch {
		case row == nil:
		case !managed:
			return refused()
		case a.Op == Delete && (w.malformed || row.DeletionPolicy == registry.PolicyDelete):
			// A malformed row may record Delete: the SQL deletes it then.
			if !w.s.Deleting || w.s.Policy() != studentv1.DeletionPolicyDelete || w.crdDeleting || w.behind {
				t.Fatalf("%s: the row was deleted without the word of its Student's finalizer", st)
			}
			w.row, w.history = nil, HistoryDeleted
		default:
			row.Owner, row.ReleasedBy = "", me
		}
	case Rebind:
		// Adopt's SQL binds a row with no owner (released, another system's) or the
		// owner's own; decide asks only for the first, of the Student's own name.
		if row == nil || w.malformed || row.Owner != "" && row.Owner != me {
			return refused()
		}
		if row.Owner != "" || row.Namespace != w.s.Namespace || row.Name != w.s.Name || w.history != HistoryOwned {
			t.Fatalf("%s: bound a row %s, of %s/%s, without this owner's history of it", st, OwnedBy(*row), row.Namespace, row.Name)
		}
		rec := *row
		rec.Owner, rec.StudentUID, rec.Generation, rec.Management = me, w.s.UID, a.Record.Generation, a.Record.Management
		rec.DeletionPolicy, rec.ReleasedAt, rec.ReleasedBy, rec.ReleaseCause = a.Record.DeletionPolicy, time.Time{}, "", ""
		w.row = &rec
	case Release:
		switch {
		case row == nil:
		case !mine:
			return refused()
		case !w.malformed && row.Generation > a.Record.Generation:
			f.Row.Stale = true
			return errFact
		default:
			rec := a.Record
			rec.Owner, rec.ReleasedBy, rec.DeletionPolicy = "", me, registry.PolicyOrphan
			write(rec)
		}
	default:
		t.Fatalf("%s: unknown op %d", st, a.Op)
	}
	return nil
}

// plan is what the controller's plan says for the world: the decision over the facts
// read from it, with nothing written.
func (w *world) plan(t *testing.T, st state) []Action {
	f := w.facts()
	if err := w.answer(AskRow, &f); err != nil {
		t.Fatal(err)
	}
	d, err := Settle(&f, w.answer)
	if err != nil {
		t.Fatalf("%s: %v", st, err)
	}
	return d.Actions
}

// remedied are the reasons a Student may be left with: each has a section in
// docs/troubleshooting.md that names the one thing to do.
func remedied(t *testing.T) map[string]bool {
	doc, err := os.ReadFile("../../docs/troubleshooting.md")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^## (\w+)$`).FindAllStringSubmatch(string(doc), -1) {
		out[m[1]] = true
	}
	return out
}

// TestModel checks the half of the space where the Student is live, and the half
// where it is being deleted, side by side.
func TestModel(t *testing.T) {
	docs := remedied(t)
	// The walk allocates much and keeps little: collected less often, it takes half
	// the time.
	gc := debug.SetGCPercent(1000)
	t.Cleanup(func() { debug.SetGCPercent(gc) })
	for _, live := range []bool{true, false} {
		t.Run(fmt.Sprintf("live=%v", live), func(t *testing.T) {
			t.Parallel()
			model(t, docs, live)
		})
	}
}

func model(t *testing.T, docs map[string]bool, live bool) {
	n := 0
	for st := range states {
		if st.live != live {
			continue
		}
		n++
		w := newWorld(st)
		planned := newWorld(st).plan(t, st)
		var first, all []Action
		for round := range 3 {
			applied := w.sync(t, st)
			if round == 0 {
				first = applied
			}
			all = append(all, applied...)
		}
		if got, want := ops(first), ops(planned); !slices.Equal(got, want) {
			t.Errorf("%s: the plan says %v, the sync applied %v", st, want, got)
		}
		switch {
		case w.gone, w.s.Paused, w.s.Deleting && !st.finalizer:
			// Gone, held still, or not this controller's to let go.
		case w.crdOlder && st.live:
			// Nothing is written for a live Student while the served CRD is older: a
			// write would drop the fields it lacks. The Pod is not ready meanwhile.
			if len(all) > 0 || w.status != nil {
				t.Errorf("%s: written under an older CRD: %v", st, ops(all))
			}
		case w.status == nil:
			t.Errorf("%s: no status after three syncs", st)
		case !w.status.Ready && !docs[w.status.Reason]:
			t.Errorf("%s: stuck not Ready with %q, which docs/troubleshooting.md does not cover", st, w.status.Reason)
		case w.s.Deleting && w.result != Terminal:
			t.Errorf("%s: still deleting after three syncs, %+v", st, *w.status)
		}
	}
	t.Logf("%d states", n)
}

// ops names the actions applied, as a plan names them.
func ops(actions []Action) []string {
	var out []string
	for _, a := range actions {
		name := a.Op.String()
		if a.Op == Insert {
			name = Upsert.String()
		}
		out = append(out, name)
	}
	return out
}

// TestSweepModel walks the sweep's decision over the rows of the model and the
// Students that name them, or none: it releases a row only when no Student names
// it and the row is the owner's and managed, and lets go of nothing past its bound
// or on a registry behind the cluster's mark.
func TestSweepModel(t *testing.T) {
	n := 0
	for st := range states {
		if st.binding != ownKey || st.history != HistoryOther || st.quorum != QuorumCurrent || st.crdDeleting || st.crdOlder || st.undoLeft || st.behind {
			continue // facts the sweep does not read
		}
		w := newWorld(st)
		for _, named := range []bool{true, false} {
			s := &w.s
			if !named {
				s = nil
			}
			if w.malformed || w.row == nil && s == nil {
				continue // the sweep skips unreadable rows; a row it lists exists
			}
			n++
			ours := w.row != nil && w.row.Owner == me && w.row.Management == ""
			switch a := Sweep(me, w.row, s); {
			case a == SweepRelease && (named || !ours):
				t.Errorf("%s named=%v: the sweep releases a row %s", st, named, OwnedBy(*w.row))
			case a != SweepRelease && !named && ours:
				t.Errorf("%s: the sweep keeps the owner's row without a Student", st)
			case a == SweepResync && (w.s.Paused || w.s.Deleting):
				t.Errorf("%s: the sweep queues a Student that it should leave alone", st)
			}
		}
	}
	for orphans := range 4 {
		for bound := 1; bound < 3; bound++ {
			for _, behind := range []bool{false, true} {
				n++
				if SweepHolds(orphans, bound, behind) == SweepLetsGo && (orphans > bound || orphans > 0 && behind) {
					t.Errorf("the sweep lets go of %d orphans with bound %d, the registry behind: %v", orphans, bound, behind)
				}
			}
		}
	}
	t.Logf("%d cases", n)
}
