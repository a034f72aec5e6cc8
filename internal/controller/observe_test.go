package controller

import (
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/student-controller/student-controller/internal/registry"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

func observing(s *studentv1.Student) { s.Spec.Management = studentv1.ManagementObserve }

// conditionOf returns the Student's condition of type t as the API server has it.
func (f *fixture) conditionOf(name, t string) *metav1.Condition {
	f.t.Helper()
	return meta.FindStatusCondition(f.get("school", name).Status.Conditions, t)
}

// historyLen is how many history rows the registry holds of the Student name.
func (f *fixture) historyLen(name string) int {
	f.t.Helper()
	h, err := f.registry.History(f.ctx, "school", name)
	if err != nil {
		f.t.Fatal(err)
	}
	return len(h)
}

// TestObserve: an observed Student's row is compared and reported, never written; the
// one registry write is the mark that keeps the row from the sweep, once.
func TestObserve(t *testing.T) {
	t.Run("in line, drifted, in line again: conditions, one Event per change, the metric, no row write", func(t *testing.T) {
		f := newFixture(t, newStudent("a", withFinalizer, observing))
		row := recordOf(owner, newStudent("a", observing))
		f.put(row)
		if err := f.registry.MarkObserved(f.ctx, row.UID, owner); err != nil {
			t.Fatal(err)
		}
		written := f.historyLen("a")

		sync := func() {
			t.Helper()
			f.observe("school", "a")
			if err := f.ctrl.sync(f.ctx, "school/a"); err != nil {
				t.Fatal(err)
			}
		}
		sync()
		if c := f.conditionOf("a", studentv1.ConditionDrifted); c == nil || c.Status != metav1.ConditionFalse {
			t.Errorf("Drifted: %+v, want False", c)
		}
		if c := f.conditionOf("a", studentv1.ConditionReady); c == nil || c.Status != metav1.ConditionTrue || c.Reason != studentv1.ReasonInLine {
			t.Errorf("Ready: %+v, want True, InLine", c)
		}
		if ev := f.events(); len(ev) != 0 {
			t.Errorf("events when in line from the start: %v", ev)
		}

		db := f.rawDB()
		if _, err := db.ExecContext(f.ctx, `UPDATE students SET school = 'elsewhere' WHERE uid = ?`, row.UID); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			sync()
		}
		if c := f.conditionOf("a", studentv1.ConditionDrifted); c == nil || c.Status != metav1.ConditionTrue || c.Reason != studentv1.ReasonDrifted {
			t.Errorf("Drifted: %+v, want True", c)
		}
		if c := f.conditionOf("a", studentv1.ConditionReady); c == nil || c.Status != metav1.ConditionFalse || c.Reason != studentv1.ReasonDrifted {
			t.Errorf("Ready: %+v, want False, Drifted", c)
		}
		if ev := f.events(); !slices.Equal(ev, []string{"Warning Drifted"}) {
			t.Errorf("events over two syncs of a drifted row: %v, want one Warning Drifted", ev)
		}
		if n := testutil.ToFloat64(f.metrics.drifted); n != 1 {
			t.Errorf("students_drifted = %v, want 1", n)
		}
		if n := testutil.ToFloat64(f.metrics.notReady); n != 0 {
			t.Errorf("students_not_ready = %v, want 0: drift is reported as drift", n)
		}
		if got, err := f.registry.Get(f.ctx, row.UID); err != nil || got.School != "elsewhere" {
			t.Errorf("row after the syncs: %+v, %v; want it as the outside write left it", got, err)
		}

		if _, err := db.ExecContext(f.ctx, `UPDATE students SET school = ? WHERE uid = ?`, row.School, row.UID); err != nil {
			t.Fatal(err)
		}
		sync()
		if ev := f.events(); !slices.Equal(ev, []string{"Normal InLine"}) {
			t.Errorf("events when back in line: %v, want one Normal InLine", ev)
		}
		if n := testutil.ToFloat64(f.metrics.drifted); n != 0 {
			t.Errorf("students_drifted = %v, want 0", n)
		}
		if n := f.historyLen("a"); n != written {
			t.Errorf("history rows: %d, want %d: an observed row is never written", n, written)
		}
	})

	t.Run("no row: drifted, and none is written", func(t *testing.T) {
		f := newFixture(t, newStudent("a", withFinalizer, observing))
		if err := f.ctrl.sync(f.ctx, "school/a"); err != nil {
			t.Fatal(err)
		}
		if c := f.conditionOf("a", studentv1.ConditionDrifted); c == nil || c.Status != metav1.ConditionTrue {
			t.Errorf("Drifted: %+v, want True", c)
		}
		if rows := f.rows(); len(rows) != 0 {
			t.Errorf("rows: %v, want none", rows)
		}
	})

	t.Run("a managed row of a Student switched to Observe is marked, once; deleting the Student keeps it from the sweep", func(t *testing.T) {
		f := newFixture(t, newStudent("a", withFinalizer, observing))
		row := recordOf(owner, newStudent("a")) // managed until now
		f.put(row)
		before := f.historyLen("a")
		for range 2 {
			if err := f.ctrl.sync(f.ctx, "school/a"); err != nil {
				t.Fatal(err)
			}
			f.observe("school", "a")
		}
		got, err := f.registry.Get(f.ctx, row.UID)
		if err != nil || got.Management != registry.ManagementObserve || got.School != row.School || got.Generation != row.Generation {
			t.Errorf("row: %+v, %v; want it as it was, marked observed", got, err)
		}
		if n := f.historyLen("a"); n != before+1 {
			t.Errorf("history rows: %d, want %d: the mark, once", n, before+1)
		}

		s := f.get("school", "a")
		deleting(s)
		if _, err := f.client.BolingcavalryV1().Students("school").Update(f.ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		f.observe("school", "a")
		if err := f.ctrl.sync(f.ctx, "school/a"); err != nil {
			t.Fatal(err)
		}
		if fin := f.get("school", "a").Finalizers; slices.Contains(fin, Finalizer) {
			t.Errorf("finalizers: %v, want the controller's gone", fin)
		}
		if err := f.client.BolingcavalryV1().Students("school").Delete(f.ctx, "a", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		f.observe("school", "a")
		result, err := f.ctrl.Sweep(f.ctx)
		if err != nil || result.Orphans != 0 || result.Released != 0 {
			t.Errorf("sweep: %+v, %v; want no orphan", result, err)
		}
		if got, err := f.registry.Get(f.ctx, row.UID); err != nil || got.Owner != owner || got.DeletionPolicy != registry.PolicyDelete {
			t.Errorf("row after the deletion and a sweep: %+v, %v; want it kept as it was", got, err)
		}
	})

	t.Run("switched to Manage: the normal sync brings the row in line with one write", func(t *testing.T) {
		f := newFixture(t, newStudent("a", withFinalizer, observing))
		row := recordOf(owner, newStudent("a", observing))
		row.School = "elsewhere"
		f.put(row)
		if err := f.registry.MarkObserved(f.ctx, row.UID, owner); err != nil {
			t.Fatal(err)
		}
		if err := f.ctrl.sync(f.ctx, "school/a"); err != nil {
			t.Fatal(err)
		}
		f.observe("school", "a")
		before := f.historyLen("a")

		s := f.get("school", "a")
		s.Spec.Management = studentv1.ManagementManage
		if _, err := f.client.BolingcavalryV1().Students("school").Update(f.ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		f.observe("school", "a")
		f.events()
		for range 2 {
			if err := f.ctrl.sync(f.ctx, "school/a"); err != nil {
				t.Fatal(err)
			}
			f.observe("school", "a")
		}
		got, err := f.registry.Get(f.ctx, row.UID)
		if err != nil || got.School != s.Spec.School || got.Management != "" {
			t.Errorf("row: %+v, %v; want it in line and managed", got, err)
		}
		// One write, and just before it the row as the observed Student left it.
		if n := f.historyLen("a"); n != before+2 {
			t.Errorf("history rows: %d, want %d: one write, the row before it", n, before+2)
		}
		h, err := f.registry.History(f.ctx, "school", "a")
		if err != nil || len(h) < 2 {
			t.Fatalf("history: %+v, %v", h, err)
		}
		if kept, wrote := h[len(h)-2], h[len(h)-1]; kept.Cause != registry.CauseBeforeManaged || kept.School != "elsewhere" ||
			wrote.School != s.Spec.School {
			t.Errorf("the last two history rows: %+v, %+v; want the observed row (school elsewhere), then the write", kept, wrote)
		}
		if c := f.conditionOf("a", studentv1.ConditionDrifted); c != nil {
			t.Errorf("a managed Student has a Drifted condition: %+v", c)
		}
		if c := f.conditionOf("a", studentv1.ConditionReady); c == nil || c.Status != metav1.ConditionTrue || c.Reason != studentv1.ReasonSynced {
			t.Errorf("Ready: %+v, want True, Synced", c)
		}
		if n := testutil.ToFloat64(f.metrics.drifted); n != 0 {
			t.Errorf("students_drifted = %v, want 0", n)
		}
	})
}

// The plan of observed Students is what the controller does for them: the mark of a
// row it managed until now (its one write), drift reported, a deletion that keeps the
// row, and no orphan of a marked row whose Student is gone.
func TestPlanObserved(t *testing.T) {
	f := newFixture(t,
		newStudent("o-mark", withFinalizer, observing),
		newStudent("o-drift", withFinalizer, observing),
		newStudent("o-bye", withFinalizer, observing, deleting),
	)
	drifted := recordOf(owner, newStudent("o-drift", observing))
	drifted.School = "edited by hand"
	f.put(recordOf(owner, newStudent("o-mark")), drifted, recordOf(owner, newStudent("o-bye")), recordOf(owner, newStudent("o-ghost")))
	for _, uid := range []string{"uid-o-drift", "uid-o-ghost"} {
		if err := f.registry.MarkObserved(f.ctx, uid, owner); err != nil {
			t.Fatal(err)
		}
	}
	var students []*studentv1.Student
	for _, s := range f.ctrl.students.list() {
		students = append(students, s.student())
	}
	plan, err := PlanFor(f.ctx, f.registry, PlanScope{PlanPolicy: PlanPolicy{Owner: owner, SweepMaxDeletions: 10, SweepMaxDeletionPercent: 100}}, students)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range plan.Actions {
		got = append(got, a.Action+" "+a.Name)
	}
	want := []string{"update o-bye", "finalize o-bye", "drifted o-drift", "update o-mark"}
	if !slices.Equal(got, want) || plan.Orphans != 0 || plan.Changes() != 3 {
		t.Errorf("plan: %v, %d orphans, %d changes; want %v, 0 orphans, 3 changes", got, plan.Orphans, plan.Changes(), want)
	}

	last := f.historyLength()
	for _, s := range students {
		if err := f.ctrl.sync(f.ctx, s.Namespace+"/"+s.Name); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.ctrl.Sweep(f.ctx); err != nil {
		t.Fatal(err)
	}
	if h := f.historySince(last); !slices.Equal(h, []string{"uid-o-bye updated observed", "uid-o-mark updated observed"}) {
		t.Errorf("history of the syncs and the sweep: %v; want the two marks alone", h)
	}
	if rows := f.rows(); len(rows) != 4 {
		t.Errorf("rows: %d, want all 4 kept", len(rows))
	}
}

// An observed Student deleted before its first sync, with the Delete policy: its row,
// which it managed until then, is marked by the finalizer and kept by the sweep.
func TestObservedDeletedBeforeItsSync(t *testing.T) {
	f := newFixture(t, newStudent("a", withFinalizer, observing, deleting))
	f.put(recordOf(owner, newStudent("a"))) // managed, Delete
	if err := f.ctrl.sync(f.ctx, "school/a"); err != nil {
		t.Fatal(err)
	}
	if err := f.client.BolingcavalryV1().Students("school").Delete(f.ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.observe("school", "a")
	if result, err := f.ctrl.Sweep(f.ctx); err != nil || result.Released != 0 {
		t.Errorf("sweep: %+v, %v; want nothing let go", result, err)
	}
	if got, err := f.registry.Get(f.ctx, "uid-a"); err != nil || got.Owner != owner || got.Management != registry.ManagementObserve {
		t.Errorf("row: %+v, %v; want it kept, marked", got, err)
	}
}
