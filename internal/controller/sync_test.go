package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2/ktesting"

	"github.com/student-controller/student-controller/internal/registry"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// row is what a test checks of a registry row.
type row struct {
	Owner       string
	StudentName string
	School      string
	Generation  int64
	Written     time.Time
}

type readyState struct {
	Status  metav1.ConditionStatus
	Reason  string
	Written time.Time // status.registry.lastWrittenTime; zero when unset
}

func TestSync(t *testing.T) {
	later := start.Add(time.Minute) // the clock at sync time
	tests := map[string]struct {
		student *studentv1.Student
		rows    []registry.Record // in the registry before the sync, written at start
		down    bool              // the registry is closed before the sync
		// apiServer, when set, changes the API server's Student after the cache has it.
		apiServer func(*studentv1.Student)

		wantErr       string // "", "retry" or "terminal"
		wantRows      map[string]row
		wantReady     *readyState // nil: the object has no Ready condition; ignored when gone
		wantFinalizer bool
		wantWrites    []string
		wantEvents    []string
		wantRow       string // the action counted by the rows-written metric, if any
	}{
		"new student": {
			student:       newStudent("a"),
			wantRows:      map[string]row{"uid-a": {owner, "张三", "深圳中学", 1, later}},
			wantReady:     &readyState{metav1.ConditionTrue, studentv1.ReasonSynced, later},
			wantFinalizer: true,
			wantWrites:    []string{"patch students", "update students/status"},
			wantRow:       rowCreated, // status says it: no Event
		},
		// A sync that wrote the row and ended before the status: the row is found,
		// left as it is (no second write, no history row), and reported.
		"new student whose row was written before its status": {
			student:       newStudent("a"),
			rows:          []registry.Record{recordOf(owner, newStudent("a"))},
			wantRows:      map[string]row{"uid-a": {owner, "张三", "深圳中学", 1, start}},
			wantReady:     &readyState{metav1.ConditionTrue, studentv1.ReasonSynced, start},
			wantFinalizer: true,
			wantWrites:    []string{"patch students", "update students/status"},
		},
		"spec update": {
			student: newStudent("a", withFinalizer, func(s *studentv1.Student) { s.Generation = 1 }, synced(start),
				func(s *studentv1.Student) { s.Generation, s.Spec.School = 2, "北京四中" }),
			rows:          []registry.Record{recordOf(owner, newStudent("a"))},
			wantRows:      map[string]row{"uid-a": {owner, "张三", "北京四中", 2, later}},
			wantReady:     &readyState{metav1.ConditionTrue, studentv1.ReasonSynced, later},
			wantFinalizer: true,
			wantWrites:    []string{"update students/status"},
			wantEvents:    []string{"Normal RowUpdated"},
			wantRow:       rowUpdated,
		},
		"no-op resync": {
			student:       newStudent("a", withFinalizer, synced(start)),
			rows:          []registry.Record{recordOf(owner, newStudent("a"))},
			wantRows:      map[string]row{"uid-a": {owner, "张三", "深圳中学", 1, start}},
			wantReady:     &readyState{metav1.ConditionTrue, studentv1.ReasonSynced, start},
			wantFinalizer: true,
		},
		"row deleted behind our back": {
			student:       newStudent("a", withFinalizer, synced(start)),
			wantRows:      map[string]row{"uid-a": {owner, "张三", "深圳中学", 1, later}},
			wantReady:     &readyState{metav1.ConditionTrue, studentv1.ReasonSynced, later},
			wantFinalizer: true,
			wantWrites:    []string{"update students/status"},
			wantEvents:    []string{"Normal RowRestored"},
			wantRow:       rowRestored,
		},
		"row changed behind our back": {
			student: newStudent("a", withFinalizer, synced(start)),
			rows: []registry.Record{func() registry.Record {
				r := recordOf(owner, newStudent("a"))
				r.School = "tampered"
				return r
			}()},
			wantRows:      map[string]row{"uid-a": {owner, "张三", "深圳中学", 1, later}},
			wantReady:     &readyState{metav1.ConditionTrue, studentv1.ReasonSynced, later},
			wantFinalizer: true,
			wantWrites:    []string{"update students/status"},
			wantEvents:    []string{"Normal RowUpdated"},
			wantRow:       rowUpdated,
		},
		"cache behind a newer writer of the row": {
			// A former leader that woke up late: its cache holds generation 1, the new
			// leader has written generation 2. Nothing is written; the watch catches up.
			student: newStudent("a", withFinalizer, synced(start)),
			apiServer: func(s *studentv1.Student) {
				s.Generation, s.Spec.School, s.ResourceVersion = 2, "北京四中", "2"
			},
			rows: []registry.Record{func() registry.Record {
				r := recordOf(owner, newStudent("a"))
				r.School, r.Generation = "北京四中", 2
				return r
			}()},
			wantErr:       "retry",
			wantRows:      map[string]row{"uid-a": {owner, "张三", "北京四中", 2, start}},
			wantReady:     &readyState{metav1.ConditionTrue, studentv1.ReasonSynced, start},
			wantFinalizer: true,
		},
		"delete with policy Delete": {
			student:    newStudent("a", withFinalizer, synced(start), deleting),
			rows:       []registry.Record{recordOf(owner, newStudent("a"))},
			wantRows:   map[string]row{},
			wantReady:  &readyState{metav1.ConditionTrue, studentv1.ReasonSynced, start},
			wantWrites: []string{"patch students"},
			wantRow:    rowDeleted,
		},
		"delete with policy Orphan": {
			student:    newStudent("a", orphan, withFinalizer, synced(start), deleting),
			rows:       []registry.Record{recordOf(owner, newStudent("a"))},
			wantRows:   map[string]row{"uid-a": {"", "张三", "深圳中学", 1, later}}, // released: no owner
			wantReady:  &readyState{metav1.ConditionTrue, studentv1.ReasonSynced, start},
			wantWrites: []string{"patch students"},
			wantRow:    rowReleased,
		},
		// Stored before the CRD's enum: whatever it meant, the row is kept.
		"delete with a policy the CRD refuses now": {
			student:    newStudent("a", withFinalizer, synced(start), deleting, func(s *studentv1.Student) { s.Spec.DeletionPolicy = "orphan" }),
			rows:       []registry.Record{recordOf(owner, newStudent("a"))},
			wantRows:   map[string]row{"uid-a": {"", "张三", "深圳中学", 1, later}},
			wantReady:  &readyState{metav1.ConditionTrue, studentv1.ReasonSynced, start},
			wantWrites: []string{"patch students"},
			wantRow:    rowReleased,
		},
		// Written before rows recorded their policy: the policy is filled in, and
		// nothing else happens (no Event, no status write, updated_at kept).
		"row without a recorded policy": {
			student:       newStudent("a", withFinalizer, synced(start)),
			rows:          []registry.Record{unknownPolicy(recordOf(owner, newStudent("a")))},
			wantRows:      map[string]row{"uid-a": {owner, "张三", "深圳中学", 1, start}},
			wantReady:     &readyState{metav1.ConditionTrue, studentv1.ReasonSynced, start},
			wantFinalizer: true,
		},
		"control character in the spec: refused, no row": {
			student:    newStudent("a", func(s *studentv1.Student) { s.Spec.Name = "a\x00b" }),
			wantErr:    "terminal",
			wantRows:   map[string]row{},
			wantReady:  &readyState{metav1.ConditionFalse, studentv1.ReasonInvalidSpec, time.Time{}},
			wantWrites: []string{"update students/status"},
			wantEvents: []string{"Warning InvalidSpec"},
		},
		// Stored before the CRD refused it: the row cannot take the spec (PostgreSQL
		// refuses NUL), so it is released as last written and the deletion finishes.
		"delete with policy Orphan of a spec the registry cannot hold": {
			student:    newStudent("a", orphan, withFinalizer, synced(start), deleting, func(s *studentv1.Student) { s.Spec.Name = "a\x00b" }),
			rows:       []registry.Record{recordOf(owner, newStudent("a", orphan))},
			wantRows:   map[string]row{"uid-a": {"", "张三", "深圳中学", 1, later}},
			wantReady:  &readyState{metav1.ConditionTrue, studentv1.ReasonSynced, start},
			wantWrites: []string{"patch students"},
			wantRow:    rowReleased,
		},
		"delete of a student whose row is gone": {
			student:    newStudent("a", withFinalizer, synced(start), deleting),
			wantRows:   map[string]row{},
			wantReady:  &readyState{metav1.ConditionTrue, studentv1.ReasonSynced, start},
			wantWrites: []string{"patch students"},
		},
		"delete leaves another owner's row": {
			student:    newStudent("a", withFinalizer, deleting),
			rows:       []registry.Record{recordOf("another-controller", newStudent("a"))},
			wantRows:   map[string]row{"uid-a": {"another-controller", "张三", "深圳中学", 1, start}},
			wantWrites: []string{"patch students"},
			wantEvents: []string{"Warning RowOwnedElsewhere"},
		},
		"registry down": {
			student:       newStudent("a"),
			down:          true,
			wantErr:       "retry",
			wantReady:     &readyState{metav1.ConditionFalse, studentv1.ReasonRegistryUnavailable, time.Time{}},
			wantFinalizer: true,
			wantWrites:    []string{"patch students", "update students/status"},
			wantEvents:    []string{"Warning RegistryError"},
		},
		"registry down keeps the last written time": {
			student:       newStudent("a", withFinalizer, synced(start)),
			down:          true,
			wantErr:       "retry",
			wantReady:     &readyState{metav1.ConditionFalse, studentv1.ReasonRegistryUnavailable, start},
			wantFinalizer: true,
			wantWrites:    []string{"update students/status"},
			wantEvents:    []string{"Warning RegistryError"},
		},
		"registry down while deleting": {
			student:       newStudent("a", withFinalizer, synced(start), deleting),
			down:          true,
			wantErr:       "retry",
			wantReady:     &readyState{metav1.ConditionFalse, studentv1.ReasonRegistryUnavailable, start},
			wantFinalizer: true, // still Terminating: the delete is not lost
			wantWrites:    []string{"update students/status"},
			wantEvents:    []string{"Warning RegistryError"},
		},
		"invalid spec": {
			student:    newStudent("a", func(s *studentv1.Student) { s.Spec.Name = "  " }),
			wantErr:    "terminal",
			wantRows:   map[string]row{},
			wantReady:  &readyState{metav1.ConditionFalse, studentv1.ReasonInvalidSpec, time.Time{}},
			wantWrites: []string{"update students/status"},
			wantEvents: []string{"Warning InvalidSpec"},
		},
		"row owned by another controller": {
			student:       newStudent("a"),
			rows:          []registry.Record{recordOf("another-controller", newStudent("a"))},
			wantErr:       "terminal",
			wantRows:      map[string]row{"uid-a": {"another-controller", "张三", "深圳中学", 1, start}},
			wantReady:     &readyState{metav1.ConditionFalse, studentv1.ReasonRowOwnedElsewhere, time.Time{}},
			wantFinalizer: true,
			wantWrites:    []string{"patch students", "update students/status"},
			wantEvents:    []string{"Warning RowOwnedElsewhere"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, tc.student)
			f.put(tc.rows...)
			f.clock.SetTime(later)
			if tc.apiServer != nil {
				live := f.get(tc.student.Namespace, tc.student.Name)
				tc.apiServer(live)
				if _, err := f.client.BolingcavalryV1().Students(live.Namespace).Update(f.ctx, live, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
				f.client.ClearActions()
			}
			if tc.down {
				f.registry.Close()
			}

			err := f.ctrl.sync(f.ctx, cache.MetaObjectToName(tc.student).String())
			var term *terminalError
			switch gotErr := map[bool]string{true: "terminal", false: "retry"}[errors.As(err, &term)]; {
			case tc.wantErr == "" && err != nil:
				t.Errorf("sync: %v", err)
			case tc.wantErr != "" && err == nil:
				t.Errorf("sync succeeded, want a %s error", tc.wantErr)
			case tc.wantErr != "" && gotErr != tc.wantErr:
				t.Errorf("sync: %v is a %s error, want %s", err, gotErr, tc.wantErr)
			}

			if diff := cmp.Diff(tc.wantWrites, f.writes()); diff != "" {
				t.Errorf("API writes (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantEvents, f.events()); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
			for _, action := range []string{rowCreated, rowUpdated, rowRestored, rowDeleted, rowReleased} {
				want := 0.0
				if action == tc.wantRow {
					want = 1
				}
				if got := testutil.ToFloat64(f.metrics.rowsWritten.WithLabelValues(action)); got != want {
					t.Errorf("rows written with action %s: %v, want %v", action, got, want)
				}
			}
			if !tc.down {
				got := map[string]row{}
				for uid, r := range f.rows() {
					got[uid] = row{r.Owner, r.StudentName, r.School, r.Generation, r.UpdatedAt}
				}
				want := tc.wantRows
				if want == nil {
					want = map[string]row{}
				}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("registry rows (-want +got):\n%s", diff)
				}
			}

			s := f.get(tc.student.Namespace, tc.student.Name)
			if got := slices.Contains(s.Finalizers, Finalizer); got != tc.wantFinalizer {
				t.Errorf("finalizer present = %v, want %v", got, tc.wantFinalizer)
			}
			cond := meta.FindStatusCondition(s.Status.Conditions, studentv1.ConditionReady)
			if tc.wantReady == nil {
				if cond != nil {
					t.Errorf("Ready = %+v, want none", cond)
				}
				return
			}
			if cond == nil {
				t.Fatalf("no Ready condition; status %+v", s.Status)
			}
			var written time.Time
			if s.Status.Registry != nil && s.Status.Registry.LastWrittenTime != nil {
				written = s.Status.Registry.LastWrittenTime.UTC()
			}
			got := readyState{cond.Status, cond.Reason, written}
			if diff := cmp.Diff(*tc.wantReady, got); diff != "" {
				t.Errorf("Ready (-want +got):\n%s\nmessage: %s", diff, cond.Message)
			}
			wantObserved := s.Generation
			if tc.apiServer != nil {
				wantObserved = tc.student.Generation // the cache's: the sync wrote nothing
			}
			if s.Status.ObservedGeneration != wantObserved || cond.ObservedGeneration != wantObserved {
				t.Errorf("observedGeneration %d, condition's %d, want %d", s.Status.ObservedGeneration, cond.ObservedGeneration, wantObserved)
			}
		})
	}
}

// TestSyncWriteEconomy: a new Student costs two API writes, one registry write and no
// Event (without the admission policy: the controller adds the finalizer); the
// syncs its own writes bring back, and any resync after, cost nothing.
func TestSyncWriteEconomy(t *testing.T) {
	f := newFixture(t, newStudent("a"))
	key := "school/a"
	if err := f.ctrl.sync(f.ctx, key); err != nil {
		t.Fatal(err)
	}
	if got := f.writes(); len(got) != 2 {
		t.Errorf("a new Student cost API writes %v, want 2", got)
	}
	written := f.rows()["uid-a"].UpdatedAt

	for i := range 3 {
		f.clock.Step(time.Minute)
		f.observe("school", "a") // the watch delivers the controller's own writes
		if err := f.ctrl.sync(f.ctx, key); err != nil {
			t.Fatal(err)
		}
		if got := f.writes(); len(got) != 0 {
			t.Errorf("resync %d cost API writes %v, want none", i, got)
		}
		if got := f.rows()["uid-a"].UpdatedAt; !got.Equal(written) {
			t.Errorf("resync %d rewrote the row at %v", i, got)
		}
	}
	if got := f.events(); len(got) != 0 {
		t.Errorf("events %v, want none: a new Student's first row is reported in its status", got)
	}
}

// TestEnqueue: handlers only queue keys, tombstones of deleted objects included, and a
// change to status alone queues nothing.
func TestEnqueue(t *testing.T) {
	logger, _ := ktesting.NewTestContext(t)
	s := newStudent("a")
	s.ResourceVersion = "1"
	statusOnly := s.DeepCopy()
	statusOnly.ResourceVersion = "2"
	statusOnly.Status.ObservedGeneration = 1
	specChange := statusOnly.DeepCopy()
	specChange.Generation = 2
	finalizerAdded := statusOnly.DeepCopy()
	withFinalizer(finalizerAdded)
	finalizerAdded.ResourceVersion = "3"
	otherFinalizer := statusOnly.DeepCopy()
	otherFinalizer.Finalizers = []string{"example.com/other"}
	otherFinalizer.ResourceVersion = "3"
	finalizerRemoved := finalizerAdded.DeepCopy()
	finalizerRemoved.ResourceVersion = "4"
	finalizerRemoved.Finalizers = nil
	annotatedWith := func(key, value string) *studentv1.Student {
		s := statusOnly.DeepCopy()
		s.ResourceVersion = "5"
		annotated(key, value)(s)
		return s
	}
	pausedObj := annotatedWith(studentv1.AnnotationPaused, "true")
	requested := annotatedWith(studentv1.AnnotationReconcileRequestedAt, "1")
	otherAnnotation := annotatedWith("example.com/note", "hello")

	tests := map[string]struct {
		handle func(c *Controller)
		want   int
	}{
		"add": {func(c *Controller) { c.enqueue(logger, compactStudent(s)) }, 1},
		"tombstone": {func(c *Controller) {
			c.enqueue(logger, cache.DeletedFinalStateUnknown{Key: "school/a", Obj: compactStudent(s)})
		}, 1},
		"not an object": {func(c *Controller) { c.enqueue(logger, 42) }, 0},
		"resync":        {func(c *Controller) { c.enqueueUpdate(logger, compactStudent(s), compactStudent(s)) }, 1},
		"status only":   {func(c *Controller) { c.enqueueUpdate(logger, compactStudent(s), compactStudent(statusOnly)) }, 0},
		"spec change":   {func(c *Controller) { c.enqueueUpdate(logger, compactStudent(statusOnly), compactStudent(specChange)) }, 1},
		"own finalizer added": {func(c *Controller) {
			c.enqueueUpdate(logger, compactStudent(statusOnly), compactStudent(finalizerAdded))
		}, 0},
		"other finalizer added": {func(c *Controller) {
			c.enqueueUpdate(logger, compactStudent(statusOnly), compactStudent(otherFinalizer))
		}, 1},
		"own finalizer removed": {func(c *Controller) {
			c.enqueueUpdate(logger, compactStudent(finalizerAdded), compactStudent(finalizerRemoved))
		}, 1},
		"paused":              {func(c *Controller) { c.enqueueUpdate(logger, compactStudent(statusOnly), compactStudent(pausedObj)) }, 1},
		"unpaused":            {func(c *Controller) { c.enqueueUpdate(logger, compactStudent(pausedObj), compactStudent(statusOnly)) }, 1},
		"reconcile requested": {func(c *Controller) { c.enqueueUpdate(logger, compactStudent(statusOnly), compactStudent(requested)) }, 1},
		"another annotation": {func(c *Controller) {
			c.enqueueUpdate(logger, compactStudent(statusOnly), compactStudent(otherAnnotation))
		}, 0},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			tc.handle(f.ctrl)
			if got := f.ctrl.queue.Len(); got != tc.want {
				t.Fatalf("queue length %d, want %d", got, tc.want)
			}
			if tc.want == 1 {
				key, _ := f.ctrl.queue.Get()
				if key != "school/a" {
					t.Errorf("queued %v, want school/a", key)
				}
			}
		})
	}
}

// TestProcessNextWorkItem: the worker loop's outcomes: done, retry with backoff, and
// terminal (no retry).
func TestProcessNextWorkItem(t *testing.T) {
	tests := map[string]struct {
		student     *studentv1.Student
		key         string // the Student's own when empty
		down        bool
		wantRetries int
	}{
		"done":      {student: newStudent("a")},
		"retry":     {student: newStudent("a"), down: true, wantRetries: 1},
		"terminal":  {student: newStudent("a", func(s *studentv1.Student) { s.Spec.School = "" })},
		"malformed": {student: newStudent("a"), key: "school/a/b"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, tc.student)
			if tc.down {
				f.registry.Close()
			}
			key := tc.key
			if key == "" {
				key = cache.MetaObjectToName(tc.student).String()
			}
			f.ctrl.queue.Add(key)
			if !f.ctrl.processNextWorkItem(f.ctx) {
				t.Fatal("processNextWorkItem stopped")
			}
			if got := f.ctrl.queue.NumRequeues(key); got != tc.wantRetries {
				t.Errorf("retries %d, want %d", got, tc.wantRetries)
			}
		})
	}
}

// TestRegistryErrorEventOnce: an outage gets one Warning per Student, not one per retry;
// the retries that find the status already saying so write nothing and send nothing.
func TestRegistryErrorEventOnce(t *testing.T) {
	f := newFixture(t, newStudent("a", withFinalizer, synced(start)))
	f.registry.Close()
	key := "school/a"
	for i := range 3 {
		f.clock.Step(time.Minute)
		if err := f.ctrl.sync(f.ctx, key); err == nil {
			t.Fatalf("sync %d succeeded with the registry closed", i)
		}
		f.observe("school", "a") // the watch delivers the status written
		wantEvents, wantWrites := []string(nil), []string(nil)
		if i == 0 {
			wantEvents, wantWrites = []string{"Warning RegistryError"}, []string{"update students/status"}
		}
		if diff := cmp.Diff(wantEvents, f.events()); diff != "" {
			t.Errorf("sync %d: events (-want +got):\n%s", i, diff)
		}
		if diff := cmp.Diff(wantWrites, f.writes()); diff != "" {
			t.Errorf("sync %d: API writes (-want +got):\n%s", i, diff)
		}
	}
}

// TestStaleCache: a replica whose cache is behind the API server (it has just taken the
// lead with a watch that was cut) writes no row for a Student that is gone, and none
// from a version that is not the API server's.
func TestStaleCache(t *testing.T) {
	// Its row was written, then deleted by the previous leader's finalizer: the
	// registry must not see it again, even for a moment.
	t.Run("restore for a Student gone", func(t *testing.T) {
		f := newFixture(t, newStudent("a", withFinalizer, synced(start)))
		if err := f.client.BolingcavalryV1().Students("school").Delete(f.ctx, "a", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		f.client.ClearActions()
		f.clock.SetTime(start.Add(time.Minute))
		if err := f.ctrl.sync(f.ctx, "school/a"); err != nil {
			t.Fatalf("sync: %v", err)
		}
		if rows := f.rows(); len(rows) != 0 {
			t.Errorf("rows after the sync: %v, want none: the Student is gone", rows)
		}
		if got := f.writes(); len(got) != 0 {
			t.Errorf("API writes: %v, want none", got)
		}
	})

	// The API server has a newer version: the sync waits for the watch to bring it.
	t.Run("restore from an older version", func(t *testing.T) {
		f := newFixture(t, newStudent("a", withFinalizer, synced(start)))
		live := f.get("school", "a")
		live.Spec.School = "北京四中"
		live.ResourceVersion = "2" // the fake keeps what it is given; an API server moves it
		if _, err := f.client.BolingcavalryV1().Students("school").Update(f.ctx, live, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		f.client.ClearActions()
		if err := f.ctrl.sync(f.ctx, "school/a"); !errors.Is(err, errCacheBehind) {
			t.Fatalf("sync: %v, want errCacheBehind", err)
		}
		if rows := f.rows(); len(rows) != 0 {
			t.Errorf("rows after the sync: %v, want none until the cache catches up", rows)
		}
		// Waiting for the watch is no failure: it feeds no error metric (nor the
		// StudentSyncsFailing alert) and is retried.
		f.ctrl.queue.Add("school/a")
		f.ctrl.processNextWorkItem(f.ctx)
		if errs, conflicts := testutil.ToFloat64(f.metrics.reconcileTotal.WithLabelValues(resultError)),
			testutil.ToFloat64(f.metrics.reconcileTotal.WithLabelValues(resultConflict)); errs != 0 || conflicts != 1 {
			t.Errorf("syncs counted: %v errors, %v conflicts; want 0 and 1", errs, conflicts)
		}
		if f.ctrl.queue.NumRequeues("school/a") != 1 {
			t.Error("the key is not queued again")
		}
	})

	// A first write cannot be told from a stale one without a request per new Student;
	// when the status write finds the Student gone, the row is released: absence
	// destroys nothing, and registry prune deletes it when asked.
	t.Run("first write for a Student gone", func(t *testing.T) {
		f := newFixture(t, newStudent("a", withFinalizer))
		if err := f.client.BolingcavalryV1().Students("school").Delete(f.ctx, "a", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		f.client.ClearActions()
		if err := f.ctrl.sync(f.ctx, "school/a"); err != nil {
			t.Fatalf("sync: %v", err)
		}
		if row := f.rows()["uid-a"]; row.Owner != "" || row.ReleaseCause != registry.CauseStaleCache || !registry.Prunable(row, owner) {
			t.Errorf("row after the sync: %+v, want it released for the stale cache, prunable: the Student is gone", row)
		}
		if diff := cmp.Diff([]string{"update students/status"}, f.writes()); diff != "" {
			t.Errorf("API writes (-want +got):\n%s", diff)
		}
		if got := testutil.ToFloat64(f.metrics.releasedAbsent); got != 1 {
			t.Errorf("rows released without their Student: %v, want 1", got)
		}
	})

	// The same, when the status write fails otherwise (a timeout, an overloaded API
	// server): the row must not wait for the next sweep either.
	t.Run("first write for a Student gone, status write failing", func(t *testing.T) {
		f := newFixture(t, newStudent("a", withFinalizer))
		if err := f.client.BolingcavalryV1().Students("school").Delete(f.ctx, "a", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		f.client.PrependReactor("update", "students", func(a k8stesting.Action) (bool, runtime.Object, error) {
			if a.GetSubresource() == "status" {
				return true, nil, apierrors.NewServiceUnavailable("overloaded")
			}
			return false, nil, nil
		})
		_ = f.ctrl.sync(f.ctx, "school/a")
		if row := f.rows()["uid-a"]; row.Owner != "" || row.ReleaseCause != registry.CauseStaleCache {
			t.Errorf("row after the sync: %+v, want it released: the Student is gone", row)
		}
	})
}

// TestNotLeading: a replica that cannot know it still leads (Config.Leading refuses)
// writes nothing, to the API or the registry, whatever the Student needs, and leaves
// the key for later; once it may write again, the same sync does the work. The syncs
// are run directly too, past processNextWorkItem's own check, so that each write's
// guard is what refuses.
func TestNotLeading(t *testing.T) {
	tests := map[string]struct {
		student *studentv1.Student
		rows    []registry.Record
		// then is what the sync writes once allowed.
		then []string
	}{
		"new student":      {student: newStudent("a"), then: []string{"patch students", "update students/status"}},
		"row missing":      {student: newStudent("a", withFinalizer, synced(start)), then: []string{"update students/status"}},
		"status behind":    {student: newStudent("a", withFinalizer), rows: []registry.Record{recordOf(owner, newStudent("a"))}, then: []string{"update students/status"}},
		"deleting":         {student: newStudent("a", withFinalizer, synced(start), deleting), rows: []registry.Record{recordOf(owner, newStudent("a"))}, then: []string{"patch students"}},
		"deleting, orphan": {student: newStudent("a", orphan, withFinalizer, synced(start), deleting), rows: []registry.Record{recordOf(owner, newStudent("a"))}, then: []string{"patch students"}},
		"spec changed":     {student: newStudent("a", withFinalizer, synced(start), func(s *studentv1.Student) { s.Generation, s.Spec.School = 2, "北京四中" }), rows: []registry.Record{recordOf(owner, newStudent("a"))}, then: []string{"update students/status"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, tc.student)
			f.put(tc.rows...)
			f.clock.SetTime(start.Add(time.Minute)) // rows written now differ from start's
			before := f.rows()
			var leading atomic.Bool
			f.ctrl.write.leading = gateFunc(func() error {
				if !leading.Load() {
					return errors.New("lease renewed 20s ago, past the renew deadline")
				}
				return nil
			})
			key := cache.MetaObjectToName(tc.student).String()
			f.ctrl.queue.Add(key)
			if !f.ctrl.processNextWorkItem(f.ctx) {
				t.Fatal("the queue shut down")
			}
			if got := f.writes(); len(got) != 0 {
				t.Errorf("API writes while not leading: %v", got)
			}
			if diff := cmp.Diff(before, f.rows()); diff != "" {
				t.Errorf("registry rows changed while not leading (-before +after):\n%s", diff)
			}
			if got := f.events(); len(got) != 0 {
				t.Errorf("Events while not leading: %v", got)
			}
			if err := f.ctrl.sync(f.ctx, key); !errors.Is(err, ErrNotLeading) {
				t.Errorf("sync while not leading: %v, want ErrNotLeading", err)
			}

			leading.Store(true)
			if err := f.ctrl.sync(f.ctx, key); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.then, f.writes()); diff != "" {
				t.Errorf("API writes once leading (-want +got):\n%s", diff)
			}
		})
	}

	// A sweep is refused before it judges anything: by a cache as old as a pause, live
	// rows look like orphans, and a refusal for too many would raise an alert for
	// nothing. The fixture's bound is 2 rows.
	for name, orphans := range map[string]int{"sweep, no orphan": 0, "sweep, one orphan": 1, "sweep, more orphans than the bound": 5} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			for i := range orphans {
				f.put(recordOf(owner, newStudent(fmt.Sprintf("gone-%d", i))))
			}
			f.client.ClearActions()
			f.ctrl.write.leading = gateFunc(func() error { return errors.New("another replica leads") })
			result, err := f.ctrl.Sweep(f.ctx)
			if !errors.Is(err, ErrNotLeading) {
				t.Errorf("sweep while not leading: %v, want ErrNotLeading", err)
			}
			if result.Refused {
				t.Error("the sweep reported a refusal while not leading")
			}
			if got := len(f.rows()); got != orphans {
				t.Errorf("rows after a sweep while not leading: %d, want the %d it found", got, orphans)
			}
			if got := f.client.Actions(); len(got) != 0 {
				t.Errorf("API requests of a sweep while not leading: %v, want none", got)
			}
		})
	}

	// Config.Leading is what New hands to the write path.
	t.Run("config", func(t *testing.T) {
		f := newFixture(t, newStudent("a"))
		c, err := New(f.ctx, f.client, f.informers, f.registry, f.recorder,
			Config{Owner: owner, Leading: gateFunc(func() error { return errors.New("not yet") })})
		if err != nil {
			t.Fatal(err)
		}
		defer c.queue.ShutDown()
		if err := c.sync(f.ctx, "school/a"); !errors.Is(err, ErrNotLeading) {
			t.Errorf("sync of a controller whose Config.Leading refuses: %v, want ErrNotLeading", err)
		}
		if got := f.writes(); len(got) != 0 {
			t.Errorf("API writes: %v, want none", got)
		}
	})
}

// TestNotReadyGauge: student_controller_students_not_ready counts the Students whose
// last sync left them not Ready, and drops them once Ready, deleted or gone.
func TestNotReadyGauge(t *testing.T) {
	invalid := func(s *studentv1.Student) { s.Spec.Name = " " }
	f := newFixture(t, newStudent("a", invalid), newStudent("b", invalid), newStudent("c"))
	for _, key := range []string{"school/a", "school/b", "school/c"} {
		_ = f.ctrl.sync(f.ctx, key) // a and b are refused: terminal
	}
	if got := testutil.ToFloat64(f.metrics.notReady); got != 2 {
		t.Fatalf("not ready after the first syncs: %v, want 2 (a and b)", got)
	}

	a := f.get("school", "a")
	a.Spec.Name = "张三"
	if _, err := f.client.BolingcavalryV1().Students("school").Update(f.ctx, a, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.observe("school", "a")
	if err := f.ctrl.sync(f.ctx, "school/a"); err != nil {
		t.Fatal(err)
	}
	if err := f.client.BolingcavalryV1().Students("school").Delete(f.ctx, "b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.observe("school", "b")
	if err := f.ctrl.sync(f.ctx, "school/b"); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(f.metrics.notReady); got != 0 {
		t.Errorf("not ready once a is fixed and b is gone: %v, want 0", got)
	}
}

// failingRegistry is a registry whose reads and inserts fail with a driver's text.
type failingRegistry struct {
	Registry
	err error
}

func (r failingRegistry) Get(context.Context, string) (registry.Record, error) {
	return registry.Record{}, r.err
}

func (r failingRegistry) Apply(ctx context.Context, op registry.Op) (registry.Result, error) {
	if op.Kind == registry.OpInsert {
		return registry.Result{}, r.err
	}
	return r.Registry.Apply(ctx, op)
}

// TestRegistryErrorsStayInTheLog: what the database driver said (hosts, users, file
// names) never reaches the Student's conditions or Events, which its namespace's users
// read; the controller's log has it.
func TestRegistryErrorsStayInTheLog(t *testing.T) {
	secret := `failed to connect to user=student_controller database=students host=db.internal.example: password authentication failed`
	for name, student := range map[string]*studentv1.Student{
		"a new Student's insert":  newStudent("a", withFinalizer),
		"a synced Student's read": newStudent("a", withFinalizer, synced(start)),
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, student)
			failing := failingRegistry{Registry: f.ctrl.write.registry, err: errors.New(secret)}
			f.ctrl.rows, f.ctrl.write.registry = failing, failing
			if err := f.ctrl.sync(f.ctx, "school/a"); err == nil || !strings.Contains(err.Error(), "db.internal.example") {
				t.Errorf("sync returned %v, want the cause for the log", err)
			}
			s := f.get("school", "a")
			for _, c := range s.Status.Conditions {
				if strings.Contains(c.Message, "db.internal.example") || strings.Contains(c.Message, "student_controller") {
					t.Errorf("condition %s shows the driver's text: %q", c.Type, c.Message)
				}
			}
			sent := 0
			for done := false; !done; {
				select {
				case e := <-f.recorder.Events:
					sent++
					if strings.Contains(e, "db.internal.example") || strings.Contains(e, "student_controller") {
						t.Errorf("event shows the driver's text: %q", e)
					}
				default:
					done = true
				}
			}
			if sent == 0 {
				t.Error("no Warning event for the failure")
			}
		})
	}
}

// TestFinalizerPatch: the finalizer is written with a merge patch of the finalizers
// alone, carrying the resourceVersion of the Student the sync read, so that the API
// server refuses it if the Student changed since (as it would an update); without a
// resourceVersion it is not written at all.
func TestFinalizerPatch(t *testing.T) {
	const other = "example.com/other"
	tests := map[string]struct {
		student *studentv1.Student
		want    []any
	}{
		"added": {newStudent("a", func(s *studentv1.Student) { s.Finalizers = []string{other} }), []any{other, Finalizer}},
		"removed": {newStudent("a", func(s *studentv1.Student) { s.Finalizers = []string{other, Finalizer} }, deleting),
			[]any{other}},
		"the last removed": {newStudent("a", withFinalizer, deleting), []any{}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tc.student.ResourceVersion = "7"
			f := newFixture(t, tc.student)
			if err := f.ctrl.sync(f.ctx, "school/a"); err != nil {
				t.Fatal(err)
			}
			var patches []map[string]any
			for _, a := range f.client.Actions() {
				if p, ok := a.(k8stesting.PatchAction); ok {
					if p.GetPatchType() != types.MergePatchType {
						t.Errorf("patch of type %s; want a merge patch", p.GetPatchType())
					}
					var body map[string]any
					if err := json.Unmarshal(p.GetPatch(), &body); err != nil {
						t.Fatal(err)
					}
					patches = append(patches, body)
				}
			}
			want := []map[string]any{{"metadata": map[string]any{"finalizers": tc.want, "resourceVersion": "7"}}}
			if diff := cmp.Diff(want, patches); diff != "" {
				t.Errorf("patches (-want +got):\n%s", diff)
			}
		})
	}

	t.Run("no resourceVersion", func(t *testing.T) {
		f := newFixture(t, newStudent("a", withFinalizer, deleting, func(s *studentv1.Student) { s.ResourceVersion = "" }))
		err := f.ctrl.sync(f.ctx, "school/a")
		if err == nil || !strings.Contains(err.Error(), "no resourceVersion") {
			t.Errorf("sync: %v; want the finalizer write refused for want of a resourceVersion", err)
		}
		if got := f.writes(); len(got) != 0 {
			t.Errorf("API writes %v; want none", got)
		}
	})
}

// gateFunc is a Gate of a function.
type gateFunc func() error

func (f gateFunc) Check() error { return f() }
