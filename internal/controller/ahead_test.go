package controller

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/student-controller/student-controller/internal/registry"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// TestRegistryAhead: a row at a newer generation than its Student, as after an etcd
// restore (the rows kept the specs written since the backup; the Students went back
// to it). The Student on the API server is the desired state: the row follows it, with
// a Warning Event, the metric and a history row, and nothing is retried for ever.
func TestRegistryAhead(t *testing.T) {
	later := start.Add(time.Minute)
	// ahead is the row the registry holds: three spec changes past the backup.
	ahead := func(s *studentv1.Student) registry.Record {
		r := recordOf(owner, s)
		r.Generation, r.School = 4, "school D"
		return r
	}
	tests := map[string]struct {
		student *studentv1.Student

		wantRows      map[string]row
		wantReady     bool // the Student reports Ready=True for its generation
		wantFinalizer bool
		wantEvents    []string
	}{
		// The restart after the restore: status says Ready at generation 1, the row
		// holds generation 4. The sync must not trust the status.
		"restored Student, status Ready": {
			student:       newStudent("r1", withFinalizer, synced(start)),
			wantRows:      map[string]row{"uid-r1": {owner, "张三", "深圳中学", 1, later}},
			wantReady:     true,
			wantFinalizer: true,
			wantEvents:    []string{"Warning RegistryAhead"},
		},
		// A spec change after the restore (generation 2, still behind the row's 4).
		"spec change after the restore": {
			student: newStudent("r1", withFinalizer, synced(start),
				func(s *studentv1.Student) { s.Generation, s.Spec.School = 2, "school E" }),
			wantRows:      map[string]row{"uid-r1": {owner, "张三", "school E", 2, later}},
			wantReady:     true,
			wantFinalizer: true,
			wantEvents:    []string{"Warning RegistryAhead"},
		},
		// Deleting an Orphan Student: its release was refused as stale, for ever.
		"Orphan Student deleted": {
			student:    newStudent("r1", withFinalizer, orphan, synced(start), deleting),
			wantRows:   map[string]row{"uid-r1": {"", "张三", "深圳中学", 1, later}},
			wantEvents: []string{"Warning RegistryAhead"},
		},
		"Delete Student deleted": {
			student:  newStudent("r2", withFinalizer, synced(start), deleting),
			wantRows: map[string]row{},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, tc.student)
			f.put(ahead(tc.student))
			f.clock.SetTime(later)

			f.ctrl.queue.Add(keyOf(tc.student))
			f.ctrl.processNextWorkItem(f.ctx)
			if n := f.ctrl.queue.NumRequeues(keyOf(tc.student)); n != 0 {
				t.Errorf("the key was queued again (%d): the sync did not finish", n)
			}
			if errs := testutil.ToFloat64(f.metrics.reconcileTotal.WithLabelValues(resultSuccess)); errs != 1 {
				t.Errorf("successful syncs: %v, want 1", errs)
			}

			got := map[string]row{}
			for uid, r := range f.rows() {
				got[uid] = row{r.Owner, r.StudentName, r.School, r.Generation, r.UpdatedAt}
			}
			if diff := cmp.Diff(tc.wantRows, got); diff != "" {
				t.Errorf("registry rows (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantEvents, f.events()); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
			wantAhead := float64(len(tc.wantEvents))
			if got := testutil.ToFloat64(f.metrics.registryAhead); got != wantAhead {
				t.Errorf("rows ahead counted: %v, want %v", got, wantAhead)
			}
			if wantAhead > 0 {
				h, err := f.registry.History(f.ctx, tc.student.Namespace, tc.student.Name)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.ContainsFunc(h, func(e registry.HistoryEntry) bool {
					return e.Action == registry.ActionUpdated && e.Cause == registry.CauseRegistryAhead && e.Generation == tc.student.Generation
				}) {
					t.Errorf("no history row %s/%s at generation %d: %+v", registry.ActionUpdated, registry.CauseRegistryAhead, tc.student.Generation, h)
				}
			}

			s, err := f.client.BolingcavalryV1().Students(tc.student.Namespace).Get(f.ctx, tc.student.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got := slices.Contains(s.Finalizers, Finalizer); got != tc.wantFinalizer {
				t.Errorf("finalizer present = %v, want %v", got, tc.wantFinalizer)
			}
			if tc.wantReady {
				cond := meta.FindStatusCondition(s.Status.Conditions, studentv1.ConditionReady)
				if cond == nil || cond.Status != metav1.ConditionTrue || cond.ObservedGeneration != s.Generation {
					t.Errorf("Ready = %+v, want True at generation %d", cond, s.Generation)
				}
				if w := s.Status.Registry; w == nil || w.LastWrittenTime == nil || !w.LastWrittenTime.Time.Equal(later) {
					t.Errorf("status.registry = %+v, want the row written at %v", w, later)
				}
			}
		})
	}

	// The API server has a newer version of the Student than the cache: this cache
	// is behind, not the cluster; the row is left as it is and the sync retried.
	t.Run("cache behind", func(t *testing.T) {
		s := newStudent("r1", withFinalizer, synced(start))
		f := newFixture(t, s)
		f.put(ahead(s))
		live := f.get("school", "r1")
		live.ResourceVersion = "2"
		if _, err := f.client.BolingcavalryV1().Students("school").Update(f.ctx, live, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := f.ctrl.sync(f.ctx, "school/r1"); !errors.Is(err, errCacheBehind) {
			t.Fatalf("sync: %v, want errCacheBehind", err)
		}
		if r := f.rows()["uid-r1"]; r.Generation != 4 || r.School != "school D" {
			t.Errorf("row %+v, want it left at generation 4", r)
		}
		if got := testutil.ToFloat64(f.metrics.registryAhead); got != 0 {
			t.Errorf("rows ahead counted: %v, want 0", got)
		}
	})
}

// TestRegistryAheadBound: past Config.MaxRewinds rows taken back, a row ahead is left
// as it is and its Student reports it: so many rows ahead looks like a cloned cluster
// that shares production's registry, whose older Students would roll its rows back.
func TestRegistryAheadBound(t *testing.T) {
	a, b := newStudent("a", withFinalizer, synced(start)), newStudent("b", withFinalizer, synced(start))
	f := newFixture(t, a, b)
	f.ctrl.cfg.MaxRewinds = 1
	for _, s := range []*studentv1.Student{a, b} {
		r := recordOf(owner, s)
		r.Generation, r.School = 4, "school D"
		f.put(r)
	}
	if err := f.ctrl.sync(f.ctx, "school/a"); err != nil {
		t.Fatalf("the first row ahead: %v, want it taken back", err)
	}
	var term *terminalError
	if err := f.ctrl.sync(f.ctx, "school/b"); !errors.As(err, &term) {
		t.Fatalf("the second row ahead, past the bound: %v, want a terminal error", err)
	}
	rows := f.rows()
	if rows["uid-a"].Generation != 1 || rows["uid-b"].Generation != 4 || rows["uid-b"].School != "school D" {
		t.Errorf("rows %+v: want a's taken back, b's left at generation 4", rows)
	}
	cond := meta.FindStatusCondition(f.get("school", "b").Status.Conditions, studentv1.ConditionReady)
	if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != studentv1.ReasonRegistryAhead {
		t.Errorf("b's Ready = %+v, want False with reason %s", cond, studentv1.ReasonRegistryAhead)
	}
	if diff := cmp.Diff([]string{"Warning RegistryAhead", "Warning RegistryAhead"}, f.events()); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

func keyOf(s *studentv1.Student) string { return s.Namespace + "/" + s.Name }

// TestTakeBack: a live Student whose row this owner released (its Orphan finalizer
// ran, then an etcd restore brought the Student back) takes the row back, Ready; the
// take-backs count against Config.MaxRewinds, past which the Student says why and
// nothing is written; a row another owner holds now stays theirs.
func TestTakeBack(t *testing.T) {
	a, b := newStudent("a", withFinalizer, synced(start), orphan), newStudent("b", withFinalizer, synced(start), orphan)
	theirs := newStudent("c", withFinalizer, synced(start), orphan)
	f := newFixture(t, a, b, theirs)
	f.ctrl.cfg.MaxRewinds = 1
	for _, s := range []*studentv1.Student{a, b} {
		f.put(recordOf(owner, s))
		if _, err := f.registry.Release(f.ctx, recordOf(owner, s), "finalizer"); err != nil {
			t.Fatal(err)
		}
	}
	f.put(recordOf("another-controller", theirs))

	if err := f.ctrl.sync(f.ctx, "school/a"); err != nil {
		t.Fatalf("the first released row: %v, want it taken back", err)
	}
	var term *terminalError
	if err := f.ctrl.sync(f.ctx, "school/b"); !errors.As(err, &term) {
		t.Fatalf("the second released row, past the bound: %v, want a terminal error", err)
	}
	if err := f.ctrl.sync(f.ctx, "school/c"); !errors.As(err, &term) {
		t.Fatalf("another owner's row: %v, want a terminal error", err)
	}
	rows := f.rows()
	if r := rows["uid-a"]; r.Owner != owner || r.ReleasedBy != "" {
		t.Errorf("a's row %+v: want it owned again", r)
	}
	if r := rows["uid-b"]; r.Owner != "" || r.ReleasedBy != owner {
		t.Errorf("b's row %+v: want it left released", r)
	}
	if r := rows["uid-c"]; r.Owner != "another-controller" {
		t.Errorf("c's row %+v: want it left to its owner", r)
	}
	for name, want := range map[string]string{"a": studentv1.ReasonSynced, "b": studentv1.ReasonRowReleased, "c": studentv1.ReasonRowOwnedElsewhere} {
		cond := meta.FindStatusCondition(f.get("school", name).Status.Conditions, studentv1.ConditionReady)
		if cond == nil || cond.Reason != want {
			t.Errorf("%s's Ready = %+v, want reason %s", name, cond, want)
		}
	}
	cond := meta.FindStatusCondition(f.get("school", "c").Status.Conditions, studentv1.ConditionReady)
	if cond == nil || !strings.Contains(cond.Message, `"another-controller"`) || !strings.Contains(cond.Message, "registry adopt") {
		t.Errorf("c's Ready = %+v, want it to name the owner and what to do", cond)
	}
	if diff := cmp.Diff([]string{"Warning RowTakenBack", "Warning RowReleased", "Warning RowOwnedElsewhere"}, f.events()); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

// TestUndoBoundHoldsAcrossWorkers: workers sync in parallel, and the bound holds for
// all of them together. Eight Students whose rows the history says were deleted,
// synced at once with a bound of one: one row is written again, seven Students
// refused. (A check before the write and a count after it let several workers pass
// the last undo: a clone's controller wrote both of two deleted rows with a bound of
// one.)
func TestUndoBoundHoldsAcrossWorkers(t *testing.T) {
	var all []*studentv1.Student
	for i := range 8 {
		all = append(all, newStudent(fmt.Sprintf("s%d", i), withFinalizer, synced(start)))
	}
	f := newFixture(t, all...)
	f.ctrl.cfg.MaxRewinds = 1
	for _, s := range all {
		f.put(recordOf(owner, s))
		if _, err := f.registry.Delete(f.ctx, string(s.UID), owner, registry.CauseFinalizer); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	gate := make(chan struct{})
	refused := make(chan string, len(all))
	for _, s := range all {
		wg.Go(func() {
			<-gate
			var term *terminalError
			switch err := f.ctrl.sync(f.ctx, s.Namespace+"/"+s.Name); {
			case errors.As(err, &term):
				refused <- s.Name
			case err != nil:
				t.Errorf("sync %s: %v", s.Name, err)
			}
		})
	}
	close(gate)
	wg.Wait()
	close(refused)
	if rows := f.rows(); len(rows) != 1 || len(refused) != len(all)-1 {
		t.Errorf("%d rows written again and %d Students refused, want 1 and %d: %v", len(rows), len(refused), len(all)-1, rows)
	}
	if got := f.ctrl.rewound.Load(); got != 1 {
		t.Errorf("undos counted: %d, want 1", got)
	}
}

// TestRecreateBound: a live Student whose row the history says was deleted (its
// finalizer ran in a cluster that went on: this one is a clone, or went back in time)
// has its row written again only within Config.MaxRewinds, counted with the rows taken
// back; past it the Student says why and nothing is written. A row missing without
// such a record is restored as before, uncounted.
func TestRecreateBound(t *testing.T) {
	a, b, c := newStudent("a", withFinalizer, synced(start)), newStudent("b", withFinalizer, synced(start)), newStudent("c", withFinalizer, synced(start))
	f := newFixture(t, a, b, c)
	f.ctrl.cfg.MaxRewinds = 1
	for _, s := range []*studentv1.Student{a, b} {
		f.put(recordOf(owner, s))
		if _, err := f.registry.Delete(f.ctx, string(s.UID), owner, registry.CauseFinalizer); err != nil {
			t.Fatal(err)
		}
	}
	// c's row is missing with no record of a delete: deleted by hand.
	var term *terminalError
	for _, key := range []string{"school/c", "school/a", "school/b"} {
		wantTerminal := key == "school/b"
		if err := f.ctrl.sync(f.ctx, key); errors.As(err, &term) != wantTerminal || (!wantTerminal && err != nil) {
			t.Fatalf("sync %s: %v, want terminal %v", key, err, wantTerminal)
		}
	}
	rows := f.rows()
	if _, ok := rows["uid-b"]; ok || len(rows) != 2 {
		t.Errorf("rows %v: want a's and c's written again, b's not", rows)
	}
	for name, want := range map[string]string{"a": studentv1.ReasonSynced, "b": studentv1.ReasonRowDeleted, "c": studentv1.ReasonSynced} {
		cond := meta.FindStatusCondition(f.get("school", name).Status.Conditions, studentv1.ConditionReady)
		if cond == nil || cond.Reason != want {
			t.Errorf("%s's Ready = %+v, want reason %s", name, cond, want)
		}
	}
	events := f.events()
	slices.Sort(events)
	if diff := cmp.Diff([]string{"Normal RowRestored", "Warning RowDeleted", "Warning RowRecreated"}, events); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

// TestOwnedElsewhereKeepsWritten: a Student refused because its row became another
// owner's keeps what its status says it wrote. When that row is then deleted, its next
// sync knows the row was written before, and writing it again after a delete counts
// against the bound: past it, nothing is written.
func TestOwnedElsewhereKeepsWritten(t *testing.T) {
	f := newFixture(t, newStudent("a", withFinalizer))
	f.ctrl.cfg.MaxRewinds = 1
	if err := f.ctrl.sync(f.ctx, "school/a"); err != nil {
		t.Fatal(err)
	}
	f.observe("school", "a")
	if _, err := f.rawDB().ExecContext(f.ctx, `UPDATE students SET owner = 'another' WHERE uid = 'uid-a'`); err != nil {
		t.Fatal(err)
	}
	var term *terminalError
	if err := f.ctrl.sync(f.ctx, "school/a"); !errors.As(err, &term) {
		t.Fatalf("sync over another owner's row: %v, want a refusal", err)
	}
	f.observe("school", "a")
	if _, err := f.registry.Delete(f.ctx, "uid-a", "another", registry.CauseFinalizer); err != nil {
		t.Fatal(err)
	}
	f.ctrl.rewound.Store(1) // the bound is spent
	if err := f.ctrl.sync(f.ctx, "school/a"); !errors.As(err, &term) {
		t.Errorf("sync after the row was deleted: %v, want a refusal past the bound", err)
	}
	if rows := f.rows(); len(rows) != 0 {
		t.Errorf("rows %v: want none written past the bound", rows)
	}
	if cond := meta.FindStatusCondition(f.get("school", "a").Status.Conditions, studentv1.ConditionReady); cond == nil || cond.Reason != studentv1.ReasonRowDeleted {
		t.Errorf("Ready = %+v, want reason %s", cond, studentv1.ReasonRowDeleted)
	}
}
