package controller

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

func annotated(key, value string) studentOption {
	return func(s *studentv1.Student) {
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[key] = value
	}
}

var pausedBy = annotated(studentv1.AnnotationPaused, "true")

// change updates a Student on the API server and in the cache, as a user and the
// watch would.
func (f *fixture) change(name string, edit func(*studentv1.Student)) {
	f.t.Helper()
	s := f.get("school", name)
	edit(s)
	if _, err := f.client.BolingcavalryV1().Students("school").Update(f.ctx, s, metav1.UpdateOptions{}); err != nil {
		f.t.Fatal(err)
	}
	f.observe("school", name)
	f.client.ClearActions()
}

// TestPaused: a paused Student's row, changed by hand, stays as it is through spec
// changes, resyncs and its deletion; the only write is one status write with the
// Synced=False condition. Unpaused, the row is repaired and the condition goes.
func TestPaused(t *testing.T) {
	edited := recordOf(owner, newStudent("a"))
	edited.School = "edited by hand"
	f := newFixture(t, newStudent("a", withFinalizer, synced(start), pausedBy), newStudent("b", withFinalizer, synced(start), pausedBy, deleting))
	f.put(edited, recordOf(owner, newStudent("b")))
	f.clock.Step(time.Minute)
	f.change("a", func(s *studentv1.Student) { s.Spec.School, s.Generation = "北京四中", 2 })

	for i := range 3 {
		for _, key := range []string{"school/a", "school/b"} {
			if err := f.ctrl.sync(f.ctx, key); err != nil {
				t.Fatalf("sync %d of paused %s: %v", i, key, err)
			}
			f.observe("school", strings.TrimPrefix(key, "school/"))
		}
		want := []string(nil)
		if i == 0 {
			want = []string{"update students/status", "update students/status"}
		}
		if diff := cmp.Diff(want, f.writes()); diff != "" {
			t.Errorf("sync %d of paused Students: API writes (-want +got):\n%s", i, diff)
		}
	}
	rows := f.rows()
	if rows["uid-a"].School != "edited by hand" || rows["uid-a"].UpdatedAt != start {
		t.Errorf("paused a's row was written: %+v", rows["uid-a"])
	}
	if _, ok := rows["uid-b"]; !ok {
		t.Error("paused, deleted b's row is gone")
	}
	for _, name := range []string{"a", "b"} {
		s := f.get("school", name)
		synced := meta.FindStatusCondition(s.Status.Conditions, studentv1.ConditionSynced)
		if synced == nil || synced.Status != metav1.ConditionFalse || synced.Reason != studentv1.ReasonPaused || !synced.LastTransitionTime.Time.Equal(start.Add(time.Minute)) {
			t.Errorf("paused %s: Synced condition %+v, want False, Paused, since the first sync", name, synced)
		}
		if ready := meta.FindStatusCondition(s.Status.Conditions, studentv1.ConditionReady); ready == nil || ready.Status != metav1.ConditionTrue {
			t.Errorf("paused %s: Ready %+v, want it kept as it was", name, ready)
		}
		if !slices.Contains(s.Finalizers, Finalizer) {
			t.Errorf("paused %s lost its finalizer", name)
		}
	}
	if got := f.get("school", "a").Status.ObservedGeneration; got != 1 {
		t.Errorf("paused a: observedGeneration %d, want 1: its spec change is not handled", got)
	}
	if got := testutil.ToFloat64(f.metrics.paused); got != 2 {
		t.Errorf("paused gauge %v, want 2", got)
	}
	if got := testutil.ToFloat64(f.metrics.pausedOldest); got != float64(start.Add(time.Minute).Unix()) {
		t.Errorf("oldest pause %v, want %d", got, start.Add(time.Minute).Unix())
	}
	if got := f.events(); len(got) != 0 {
		t.Errorf("paused Students sent Events %v", got)
	}

	// Unpaused: a's row is repaired, its Synced condition goes; b goes, with its row.
	for _, name := range []string{"a", "b"} {
		f.change(name, func(s *studentv1.Student) { delete(s.Annotations, studentv1.AnnotationPaused) })
		if err := f.ctrl.sync(f.ctx, "school/"+name); err != nil {
			t.Fatal(err)
		}
	}
	rows = f.rows()
	if rows["uid-a"].School != "北京四中" || rows["uid-a"].Generation != 2 {
		t.Errorf("unpaused a's row not repaired: %+v", rows["uid-a"])
	}
	if _, ok := rows["uid-b"]; ok {
		t.Error("unpaused, deleted b's row still there")
	}
	a := f.get("school", "a")
	if c := meta.FindStatusCondition(a.Status.Conditions, studentv1.ConditionSynced); c != nil {
		t.Errorf("unpaused a still has %+v", c)
	}
	if a.Status.ObservedGeneration != 2 {
		t.Errorf("unpaused a: observedGeneration %d, want 2", a.Status.ObservedGeneration)
	}
	if got := testutil.ToFloat64(f.metrics.paused); got != 0 {
		t.Errorf("paused gauge %v once unpaused, want 0", got)
	}
	if got := testutil.ToFloat64(f.metrics.pausedOldest); got != 0 {
		t.Errorf("oldest pause %v once none is paused, want 0", got)
	}
}

// TestPausedValues: only "true" pauses.
func TestPausedValues(t *testing.T) {
	for value, want := range map[string]bool{"true": true, "false": false, "": false, "True": false, "yes": false} {
		if got := paused(newStudent("a", annotated(studentv1.AnnotationPaused, value))); got != want {
			t.Errorf("paused with %q = %v, want %v", value, got, want)
		}
	}
}

// TestReconcileRequest: a new token syncs a Student in line at the cost of one status
// write, which records it; the same token again costs nothing. A row changed by hand is
// repaired by it. A token longer than status can hold is handled, not recorded, and
// costs no write loop.
func TestReconcileRequest(t *testing.T) {
	edited := recordOf(owner, newStudent("a"))
	edited.School = "edited by hand"
	long := strings.Repeat("x", maxReconcileToken+1)
	f := newFixture(t, newStudent("a", withFinalizer, synced(start), annotated(studentv1.AnnotationReconcileRequestedAt, "1")),
		newStudent("b", withFinalizer, synced(start), annotated(studentv1.AnnotationReconcileRequestedAt, long)))
	f.put(edited, recordOf(owner, newStudent("b")))
	f.clock.Step(time.Minute)
	for i := range 2 {
		for _, name := range []string{"a", "b"} {
			if err := f.ctrl.sync(f.ctx, "school/"+name); err != nil {
				t.Fatal(err)
			}
			f.observe("school", name)
		}
		want := []string(nil)
		if i == 0 {
			want = []string{"update students/status"}
		}
		if diff := cmp.Diff(want, f.writes()); diff != "" {
			t.Errorf("sync %d: API writes (-want +got):\n%s", i, diff)
		}
	}
	if got := f.get("school", "a").Status.LastHandledReconcileAt; got != "1" {
		t.Errorf("a: lastHandledReconcileAt %q, want 1", got)
	}
	if got := f.get("school", "b").Status.LastHandledReconcileAt; got != "" {
		t.Errorf("b: lastHandledReconcileAt %q, want none: the token is too long to record", got)
	}
	if got := f.rows()["uid-a"]; got.School != "深圳中学" {
		t.Errorf("a's row after the request: %+v, want it repaired", got)
	}
	if diff := cmp.Diff([]string{"Normal " + EventRowUpdated}, f.events()); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}
