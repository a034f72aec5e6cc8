package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/student-controller/student-controller/internal/registry"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

func TestPlanSweep(t *testing.T) {
	tampered := recordOf(owner, newStudent("b"))
	tampered.StudentName = "someone else"
	tests := map[string]struct {
		rows        []registry.Record
		students    []*studentv1.Student
		wantResync  []string
		wantOrphans []string
	}{
		"in line": {
			rows:     []registry.Record{recordOf(owner, newStudent("a"))},
			students: []*studentv1.Student{newStudent("a")},
		},
		"row missing": {
			students:   []*studentv1.Student{newStudent("a")},
			wantResync: []string{"school/a"},
		},
		"row differs": {
			rows:       []registry.Record{recordOf(owner, newStudent("a")), tampered},
			students:   []*studentv1.Student{newStudent("a"), newStudent("b")},
			wantResync: []string{"school/b"},
		},
		"student gone": {
			rows:        []registry.Record{recordOf(owner, newStudent("a")), recordOf(owner, newStudent("b"))},
			students:    []*studentv1.Student{newStudent("a")},
			wantOrphans: []string{"uid-b"},
		},
		"another owner's row": {
			rows: []registry.Record{recordOf("another-controller", newStudent("a"))},
		},
		"terminating student's row is not an orphan": {
			rows:     []registry.Record{recordOf(owner, newStudent("a"))},
			students: []*studentv1.Student{newStudent("a", withFinalizer, deleting)},
		},
		"paused student's row is left as it is": {
			rows:     []registry.Record{tampered},
			students: []*studentv1.Student{newStudent("b", pausedBy), newStudent("c", pausedBy)},
		},
		"an observed Student in line, its generation and marks aside, is not queued": {
			rows:     []registry.Record{recordOf(owner, newStudent("a", observing))},
			students: []*studentv1.Student{newStudent("a", observing, func(s *studentv1.Student) { s.Generation = 3 })},
		},
		"an observed Student whose row drifted is queued, to report it": {
			rows:       []registry.Record{tampered},
			students:   []*studentv1.Student{newStudent("b", observing)},
			wantResync: []string{"school/b"},
		},
		"an observed row without its Student is no orphan": {
			rows: []registry.Record{recordOf(owner, newStudent("a", observing))},
		},
		"a Student switched to Manage is queued, to manage its observed row": {
			rows:       []registry.Record{recordOf(owner, newStudent("a", observing))},
			students:   []*studentv1.Student{newStudent("a")},
			wantResync: []string{"school/a"},
		},
		"invalid student has no row to repair": {
			students: []*studentv1.Student{newStudent("a", func(s *studentv1.Student) { s.Spec.Name = "" })},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cached := make([]*cachedStudent, len(tc.students))
			for i, s := range tc.students {
				cached[i] = compactStudent(s)
			}
			resync, found := sweepRows(owner, tc.rows, cached)
			var orphans []string
			for _, r := range found {
				orphans = append(orphans, r.UID)
			}
			if diff := cmp.Diff(tc.wantResync, resync); diff != "" {
				t.Errorf("resync (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantOrphans, orphans); diff != "" {
				t.Errorf("orphans (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSweep runs sweeps over a real registry: orphans go, another owner's rows stay,
// drift is queued for repair, and a mass deletion past the bound is refused.
func TestSweep(t *testing.T) {
	target := &corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: "system", Name: "student-controller-0"}
	tests := map[string]struct {
		students []*studentv1.Student
		// notCached are Students the API server has and the cache does not yet.
		notCached   []*studentv1.Student
		rows        []registry.Record
		wantResult  SweepResult
		wantRows    []string
		wantQueued  []string
		wantEvents  []string
		eventTarget *corev1.ObjectReference
		scope       string // Config.Scope: --namespace, then --selector, split by a space
		behind      error  // Config.RegistryBehind's answer
	}{
		"registry behind the cluster's mark: the orphan is kept as it is, the missing row queued": {
			students: []*studentv1.Student{newStudent("a"), newStudent("b")},
			rows: []registry.Record{
				recordOf(owner, newStudent("a")),
				recordOf(owner, newStudent("gone")),
			},
			behind:     errors.New("the registry's mark is 3, below the 7 this cluster has seen"),
			wantResult: SweepResult{Rows: 2, Resync: 1, Orphans: 1, Refused: true},
			wantRows:   []string{"uid-a", "uid-gone"},
			wantQueued: []string{"school/b"},
		},
		"orphan released (its policy Delete kept), foreign row kept, missing row queued": {
			students: []*studentv1.Student{newStudent("a"), newStudent("b")},
			rows: []registry.Record{
				recordOf(owner, newStudent("a")),
				recordOf(owner, newStudent("gone")),
				recordOf("another-controller", newStudent("theirs")),
			},
			wantResult: SweepResult{Rows: 2, Resync: 1, Orphans: 1, Released: 1},
			wantRows:   []string{"uid-a", "uid-gone", "uid-theirs"},
			wantQueued: []string{"school/b"},
		},
		"mass deletion refused": {
			students: []*studentv1.Student{newStudent("a")},
			rows: []registry.Record{
				recordOf(owner, newStudent("a")),
				recordOf(owner, newStudent("x")), recordOf(owner, newStudent("y")), recordOf(owner, newStudent("z")),
			},
			eventTarget: target,
			wantResult:  SweepResult{Rows: 4, Orphans: 3, Refused: true},
			wantRows:    []string{"uid-a", "uid-x", "uid-y", "uid-z"},
			wantEvents:  []string{"Warning SweepRefused"},
		},
		"cache behind: a Student the API server has keeps its row": {
			students:  []*studentv1.Student{newStudent("a"), newStudent("b")},
			notCached: []*studentv1.Student{newStudent("late")},
			rows: []registry.Record{
				recordOf(owner, newStudent("a")),
				recordOf(owner, newStudent("b")),
				recordOf(owner, newStudent("late")),
				recordOf(owner, newStudent("gone")),
			},
			wantResult: SweepResult{Rows: 4, Orphans: 2, Released: 1, Live: 1},
			wantRows:   []string{"uid-a", "uid-b", "uid-gone", "uid-late"},
		},
		"same name, another UID: the row is an orphan": {
			notCached:  []*studentv1.Student{newStudent("a", func(s *studentv1.Student) { s.UID = "uid-a-recreated" })},
			rows:       []registry.Record{recordOf(owner, newStudent("a"))},
			wantResult: SweepResult{Rows: 1, Orphans: 1, Released: 1},
			wantRows:   []string{"uid-a"},
		},
		"at the bound": {
			students: []*studentv1.Student{newStudent("a"), newStudent("b")},
			rows: []registry.Record{recordOf(owner, newStudent("a")), recordOf(owner, newStudent("b")),
				recordOf(owner, newStudent("x")), recordOf(owner, newStudent("y"))},
			wantResult: SweepResult{Rows: 4, Orphans: 2, Released: 2},
			wantRows:   []string{"uid-a", "uid-b", "uid-x", "uid-y"},
		},
		// A wrong kubeconfig, a CRD gone: most of what the owner holds looks orphaned.
		"more than half of the owner's rows: refused, below the absolute bound too": {
			students: []*studentv1.Student{newStudent("a")},
			rows: []registry.Record{recordOf(owner, newStudent("a")),
				recordOf(owner, newStudent("x")), recordOf(owner, newStudent("y"))},
			wantResult: SweepResult{Rows: 3, Orphans: 2, Refused: true},
			wantRows:   []string{"uid-a", "uid-x", "uid-y"},
		},
		// The finalizer removed behind the controller's back, then the Student deleted.
		"lost finalizer: an Orphan row is released, not deleted": {
			students:   []*studentv1.Student{newStudent("a"), newStudent("b")},
			rows:       []registry.Record{recordOf(owner, newStudent("a")), recordOf(owner, newStudent("b")), recordOf(owner, newStudent("kept", orphan))},
			wantResult: SweepResult{Rows: 3, Orphans: 1, Released: 1},
			wantRows:   []string{"uid-a", "uid-b", "uid-kept"},
		},
		"a namespaced controller: a row of another namespace is outside its scope, never an orphan": {
			scope:    "school",
			students: []*studentv1.Student{newStudent("a"), newStudent("b")},
			rows: []registry.Record{recordOf(owner, newStudent("a")), recordOf(owner, newStudent("b")),
				recordOf(owner, newStudent("elsewhere", func(s *studentv1.Student) { s.Namespace = "other" }))},
			wantResult: SweepResult{Rows: 2},
			wantRows:   []string{"uid-a", "uid-b", "uid-elsewhere"},
		},
		"several namespaces: the rows of each are compared, a row of another namespace is left": {
			scope:    "school,college",
			students: []*studentv1.Student{newStudent("a"), newStudent("b", inNamespace("college"))},
			rows: []registry.Record{recordOf(owner, newStudent("a")), recordOf(owner, newStudent("b", inNamespace("college"))),
				recordOf(owner, newStudent("c", inNamespace("college"))), recordOf(owner, newStudent("d")),
				recordOf(owner, newStudent("elsewhere", inNamespace("other")))},
			wantResult: SweepResult{Rows: 4, Orphans: 2, Released: 2},
			wantRows:   []string{"uid-a", "uid-b", "uid-c", "uid-d", "uid-elsewhere"},
		},
		// The API server sends only the Students whose labels match; the others are there,
		// and so are the rows the controller wrote for them while they matched.
		"a label selector: the rows of Students outside it are kept and not counted against the bound": {
			scope:    " team=a",
			students: []*studentv1.Student{newStudent("a", labeled("team", "a"))},
			notCached: []*studentv1.Student{newStudent("x", labeled("team", "b")), newStudent("y"),
				newStudent("z", labeled("team", "b"))},
			rows: []registry.Record{recordOf(owner, newStudent("a")), recordOf(owner, newStudent("x")),
				recordOf(owner, newStudent("y")), recordOf(owner, newStudent("z")), recordOf(owner, newStudent("gone"))},
			wantResult: SweepResult{Rows: 2, Orphans: 1, Released: 1, Live: 3},
			wantRows:   []string{"uid-a", "uid-gone", "uid-x", "uid-y", "uid-z"},
		},
		"a row written before policies were recorded is released": {
			students:   []*studentv1.Student{newStudent("a"), newStudent("b")},
			rows:       []registry.Record{recordOf(owner, newStudent("a")), recordOf(owner, newStudent("b")), unknownPolicy(recordOf(owner, newStudent("old")))},
			wantResult: SweepResult{Rows: 3, Orphans: 1, Released: 1},
			wantRows:   []string{"uid-a", "uid-b", "uid-old"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, tc.students...)
			for _, s := range tc.notCached {
				if _, err := f.client.BolingcavalryV1().Students(s.Namespace).Create(f.ctx, s, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			f.ctrl.cfg.SweepEventTarget = tc.eventTarget
			if tc.behind != nil {
				f.ctrl.cfg.Mark = markFunc(func() error { return tc.behind })
			}
			namespaces, selector, _ := strings.Cut(tc.scope, " ")
			scope, err := ParseScope(namespaces, selector)
			if err != nil {
				t.Fatal(err)
			}
			f.ctrl.cfg.Scope = scope
			f.put(tc.rows...)
			got, err := f.ctrl.Sweep(f.ctx)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.wantResult, got); diff != "" {
				t.Errorf("result (-want +got):\n%s", diff)
			}
			var rows []string
			for uid := range f.rows() {
				rows = append(rows, uid)
			}
			if diff := cmp.Diff(tc.wantRows, rows, cmpSorted); diff != "" {
				t.Errorf("rows after the sweep (-want +got):\n%s", diff)
			}
			// Every orphan it let go is released by this owner for the sweep, with the
			// policy it recorded: a Delete row is prunable, never deleted.
			for _, row := range f.rows() {
				if tc.behind != nil && row.Owner != owner {
					t.Errorf("row %s is no longer the owner's (owner %q) while the registry is behind", row.UID, row.Owner)
				}
				if row.Owner == "" && (row.ReleasedBy != owner || row.ReleaseCause != registry.CauseSweep) {
					t.Errorf("row %s released by %q for %q; want %q, %q", row.UID, row.ReleasedBy, row.ReleaseCause, owner, registry.CauseSweep)
				}
			}
			var queued []string
			for f.ctrl.queue.Len() > 0 {
				key, _ := f.ctrl.queue.Get()
				queued = append(queued, key)
				f.ctrl.queue.Done(key)
			}
			if diff := cmp.Diff(tc.wantQueued, queued); diff != "" {
				t.Errorf("queued (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantEvents, f.events()); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
		})
	}
}

func inNamespace(ns string) func(*studentv1.Student) {
	return func(s *studentv1.Student) { s.Namespace = ns }
}

func labeled(key, value string) func(*studentv1.Student) {
	return func(s *studentv1.Student) { s.Labels = map[string]string{key: value} }
}

func unknownPolicy(r registry.Record) registry.Record {
	r.DeletionPolicy = ""
	return r
}

// TestSweepOtherCluster: a controller whose cluster is not the one the registry binds
// its owner to lets nothing go, and says why.
func TestSweepOtherCluster(t *testing.T) {
	f := newFixture(t)
	f.put(recordOf(owner, newStudent("x")))
	if _, err := f.registry.Bind(f.ctx, owner, "cluster-a"); err != nil {
		t.Fatal(err)
	}
	f.ctrl.cfg.Cluster = "cluster-b"
	if _, err := f.ctrl.Sweep(f.ctx); !errors.Is(err, registry.ErrOtherCluster) {
		t.Errorf("sweep: %v, want ErrOtherCluster", err)
	}
	if _, ok := f.rows()["uid-x"]; !ok {
		t.Error("the row is gone")
	}
}

var cmpSorted = cmpopts.SortSlices(func(a, b string) bool { return a < b })

// TestSweepStopsOnNewerSchema: once a controller of a newer version has migrated the
// registry (a rolling update, a second install), this one's sweep stops it: Run ends
// with ErrSchemaNewer, before the sweep reads or writes a row.
func TestSweepStopsOnNewerSchema(t *testing.T) {
	f := newFixture(t, newStudent("a", withFinalizer, synced(start)))
	if _, err := f.rawDB().Exec(`INSERT INTO schema_migrations (version, name, applied_at) VALUES (999, '0999_future.sql', '2026-12-03 00:00:00')`); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ctrl.Sweep(f.ctx); !errors.Is(err, registry.ErrSchemaNewer) {
		t.Fatalf("Sweep: %v, want ErrSchemaNewer", err)
	}
	if !stopsWork(fmt.Errorf("sweep: %w", registry.ErrSchemaNewer)) {
		t.Error("ErrSchemaNewer does not stop the controller's work")
	}
}

// TestCRDDeletedReleases: a Student deleted because its CRD is being deleted was not
// deleted by a user: its finalizer releases its Delete row (prunable) rather than
// deleting it, and the Student goes. A user's delete, with the CRD there, deletes it.
func TestCRDDeletedReleases(t *testing.T) {
	for name, crdGoing := range map[string]bool{"CRD being deleted": true, "CRD there": false} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, newStudent("bye", withFinalizer, synced(start), deleting))
			f.put(recordOf(owner, newStudent("bye")))
			asked := 0
			f.ctrl.cfg.CRDDeleting = func(context.Context) (bool, error) { asked++; return crdGoing, nil }
			if err := f.ctrl.sync(f.ctx, "school/bye"); err != nil {
				t.Fatal(err)
			}
			row, kept := f.rows()["uid-bye"]
			switch {
			case asked != 1:
				t.Errorf("the CRD was asked about %d times, want once", asked)
			case crdGoing && (!kept || row.Owner != "" || row.ReleaseCause != registry.CauseCRDDeleted || !registry.Prunable(row, owner)):
				t.Errorf("row %+v (there: %v): want it released for the CRD's deletion, prunable", row, kept)
			case !crdGoing && kept:
				t.Errorf("row %+v: want it deleted by the user's delete", row)
			}
			if got := f.get("school", "bye").Finalizers; len(got) != 0 {
				t.Errorf("finalizers %v: want the Student let go", got)
			}
		})
	}
}

// TestRegistryBehindReleases: on a registry behind the cluster's mark, unconfirmed,
// the finalizer of a Delete Student releases its row (prunable once confirmed)
// rather than deleting it; confirmed, the row is deleted.
func TestRegistryBehindReleases(t *testing.T) {
	for name, behind := range map[string]error{"behind": errors.New("the registry's mark is 3, below 7"), "in step": nil} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, newStudent("bye", withFinalizer, synced(start), deleting))
			f.put(recordOf(owner, newStudent("bye")))
			f.ctrl.cfg.Mark = markFunc(func() error { return behind })
			if err := f.ctrl.sync(f.ctx, "school/bye"); err != nil {
				t.Fatal(err)
			}
			row, kept := f.rows()["uid-bye"]
			switch {
			case behind != nil && (!kept || row.Owner != "" || row.ReleaseCause != registry.CauseRegistryBehind || !registry.Prunable(row, owner)):
				t.Errorf("row %+v (there: %v): want it released, prunable", row, kept)
			case behind == nil && kept:
				t.Errorf("row %+v: want it deleted by the user's delete", row)
			}
			if got := f.get("school", "bye").Finalizers; len(got) != 0 {
				t.Errorf("finalizers %v: want the Student let go", got)
			}
		})
	}
}

// TestSweepSoon: SweepSoon brings the next sweep forward, long before the interval.
func TestSweepSoon(t *testing.T) {
	f := newFixture(t)
	f.ctrl.cfg.SweepInterval = time.Hour
	f.informers.Start(f.ctx.Done())
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan error, 1)
	go func() { done <- f.ctrl.Run(ctx, 1) }()
	sweeps := func() float64 {
		return testutil.ToFloat64(f.metrics.sweepTotal.WithLabelValues(sweepClean)) + testutil.ToFloat64(f.metrics.sweepTotal.WithLabelValues(sweepRepaired))
	}
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	waitUntil("the first sweep", func() bool { return sweeps() == 1 })
	f.ctrl.SweepSoon()
	waitUntil("the sweep asked for", func() bool { return sweeps() == 2 })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// markFunc is a Mark of a function.
type markFunc func() error

func (f markFunc) Behind() error { return f() }
