package controller

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"
	_ "modernc.org/sqlite"

	"github.com/student-controller/student-controller/internal/decide"
	"github.com/student-controller/student-controller/internal/registry"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
	"github.com/student-controller/student-controller/pkg/generated/clientset/versioned/fake"
)

const owner = "test-controller"

var start = time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)

// fixture is a controller over a fake clientset and a real SQLite registry. Its
// informer is never started: tests put objects in its cache, as a watch would.
type fixture struct {
	t         testing.TB
	ctx       context.Context
	client    *fake.Clientset
	informers *Informers
	registry  *registry.Registry
	recorder  *record.FakeRecorder
	clock     *testingclock.FakeClock
	metrics   *Metrics
	ctrl      *Controller
	// dbPath is the registry's SQLite file, for writes past the registry.
	dbPath string
}

func newFixture(t testing.TB, students ...*studentv1.Student) *fixture {
	t.Helper()
	ctx := klog.NewContext(context.Background(), ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true))))
	f := &fixture{t: t, ctx: ctx, clock: testingclock.NewFakeClock(start), recorder: record.NewFakeRecorder(100),
		metrics: NewMetrics(nil), dbPath: filepath.Join(t.TempDir(), "registry.db")}
	var err error
	f.registry, err = registry.Open(ctx, "sqlite://"+f.dbPath, registry.Options{Now: f.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.registry.Close() })

	// NewClientset tracks managed fields, which it cannot do for CRDs
	// (kubernetes/kubernetes#126850); the controller does not use server-side apply.
	f.client = fake.NewSimpleClientset()
	f.informers = NewInformers(f.client, Scope{}, 0)
	f.ctrl, err = New(ctx, f.client, f.informers, f.registry, f.recorder,
		Config{Owner: owner, SweepMaxDeletions: 2, Clock: f.clock, Metrics: f.metrics})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.ctrl.queue.ShutDown)
	for _, s := range students {
		if _, err := f.client.BolingcavalryV1().Students(s.Namespace).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		f.observe(s.Namespace, s.Name)
	}
	f.client.ClearActions()
	return f
}

// put writes rows into the registry through its own upsert.
func (f *fixture) put(rows ...registry.Record) {
	f.t.Helper()
	for _, r := range rows {
		if _, err := f.registry.Upsert(f.ctx, r, registry.Why{Cause: "test"}); err != nil {
			f.t.Fatal(err)
		}
	}
}

// observe copies an object from the API server into the informer cache, as the
// watch would deliver it.
func (f *fixture) observe(namespace, name string) {
	f.t.Helper()
	s, err := f.client.BolingcavalryV1().Students(namespace).Get(f.ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		err = f.informers.Remove(namespace, name)
	} else if err == nil {
		err = f.informers.Put(s)
	}
	if err != nil {
		f.t.Fatal(err)
	}
}

// get returns the object as the API server has it.
func (f *fixture) get(namespace, name string) *studentv1.Student {
	f.t.Helper()
	s, err := f.client.BolingcavalryV1().Students(namespace).Get(f.ctx, name, metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	return s
}

// writes counts the API writes since the last call.
func (f *fixture) writes() []string {
	var out []string
	for _, a := range f.client.Actions() {
		switch a.GetVerb() {
		case "create", "update", "patch", "delete":
			w := a.GetVerb() + " " + a.GetResource().Resource
			if a.GetSubresource() != "" {
				w += "/" + a.GetSubresource()
			}
			out = append(out, w)
		}
	}
	f.client.ClearActions()
	return out
}

// events drains the Events recorded so far.
func (f *fixture) events() []string {
	var out []string
	for {
		select {
		case e := <-f.recorder.Events:
			// "Type Reason Message": keep type and reason, the message is checked apart.
			parts := strings.SplitN(e, " ", 3)
			out = append(out, parts[0]+" "+parts[1])
		default:
			return out
		}
	}
}

// rows returns every readable row of the registry, released ones and another owner's
// too, keyed by UID.
func (f *fixture) rows() map[string]registry.Record {
	f.t.Helper()
	uids, err := f.rawDB().QueryContext(f.ctx, `SELECT uid FROM students`)
	if err != nil {
		f.t.Fatal(err)
	}
	defer uids.Close()
	out := map[string]registry.Record{}
	for uids.Next() {
		var uid string
		if err := uids.Scan(&uid); err != nil {
			f.t.Fatal(err)
		}
		r, err := f.registry.Get(f.ctx, uid)
		if errors.Is(err, registry.ErrMalformed) {
			continue
		}
		if err != nil {
			f.t.Fatal(err)
		}
		out[uid] = r
	}
	if err := uids.Err(); err != nil {
		f.t.Fatal(err)
	}
	return out
}

// logged returns the messages logged so far with their key/value pairs.
func (f *fixture) logged() []string {
	var out []string
	for _, e := range klog.FromContext(f.ctx).GetSink().(ktesting.Underlier).GetBuffer().Data() {
		out = append(out, fmt.Sprint(e.Message, e.WithKVList, e.ParameterKVList))
	}
	return out
}

// rawDB opens the registry's file as another program would.
func (f *fixture) rawDB() *sql.DB {
	f.t.Helper()
	db, err := sql.Open("sqlite", "file:"+f.dbPath+"?_pragma=busy_timeout(5000)")
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { db.Close() })
	return db
}

type studentOption func(*studentv1.Student)

func newStudent(name string, opts ...studentOption) *studentv1.Student {
	s := &studentv1.Student{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "school", Name: name, UID: types.UID("uid-" + name), Generation: 1,
			// The fake API server keeps whatever resourceVersion it is given; the
			// finalizer patch needs one to be conditional.
			ResourceVersion:   "1",
			CreationTimestamp: metav1.NewTime(start),
		},
		Spec: studentv1.StudentSpec{Name: "张三", School: "深圳中学", DeletionPolicy: studentv1.DeletionPolicyDelete},
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

func withFinalizer(s *studentv1.Student) { s.Finalizers = []string{Finalizer} }

func deleting(s *studentv1.Student) {
	now := metav1.NewTime(start.Add(time.Hour))
	s.DeletionTimestamp = &now
}

func orphan(s *studentv1.Student) { s.Spec.DeletionPolicy = studentv1.DeletionPolicyOrphan }

// synced gives a Student the status that a sync at writtenAt leaves.
func synced(writtenAt time.Time) studentOption {
	return func(s *studentv1.Student) {
		written := metav1.NewTime(writtenAt)
		s.Status = studentv1.StudentStatus{
			ObservedGeneration: s.Generation,
			Conditions: []metav1.Condition{{
				Type: studentv1.ConditionReady, Status: metav1.ConditionTrue, ObservedGeneration: s.Generation,
				Reason: studentv1.ReasonSynced, Message: "The registry row matches the spec", LastTransitionTime: metav1.NewTime(start),
			}},
			Registry: &studentv1.RegistryStatus{Owner: owner, LastWrittenTime: &written, WrittenGeneration: s.Generation},
		}
	}
}

// recordOf is the registry row that a Student should have, written by owner.
func recordOf(owner string, s *studentv1.Student) registry.Record {
	return decide.Want(owner, studentFacts(owner, s).Student)
}
