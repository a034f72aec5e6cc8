package main

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/student-controller/student-controller/internal/controller"
	"github.com/student-controller/student-controller/internal/registry"
	"github.com/student-controller/student-controller/internal/testenv/pgtest"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
	"github.com/student-controller/student-controller/pkg/generated/clientset/versioned/fake"
)

// sweepResult is how long one sweep over N rows in line took, on one database.
type sweepResult struct {
	Registry string `json:"registry"`
	Rows     int    `json:"rows"`
	// Seconds are the sweeps timed, one after another over the same rows.
	Seconds []float64 `json:"seconds"`
	// FillSeconds is how long writing the N rows took (through the registry's upsert).
	FillSeconds float64 `json:"fillSeconds"`
}

func (s sweepResult) median() float64 {
	v := slices.Clone(s.Seconds)
	slices.Sort(v)
	return v[len(v)/2]
}

// sweepRuns is how many sweeps are timed per database.
const sweepRuns = 3

// measureSweeps times the sweep of student-controller over n rows that are in line with
// n cached Students, as after converging, on SQLite and on PostgreSQL: the code a
// running controller calls every --sweep-interval (Controller.Sweep: list the owned
// rows, compare each with the cache; nothing to repair, nothing to delete). The API
// server plays no part in a sweep, so the Students go straight into the cache.
func measureSweeps(ctx context.Context, n int, scratch string, pg *pgtest.Server) ([]sweepResult, error) {
	if err := pg.CreateDatabase(ctx, "sweep"); err != nil {
		return nil, err
	}
	var out []sweepResult
	for _, db := range []struct{ name, url string }{
		{"SQLite", "sqlite://" + filepath.Join(scratch, "sweep.db")},
		{"PostgreSQL", pg.URL("sweep", true)},
	} {
		say("sweep over %d rows on %s", n, db.name)
		r, err := measureSweep(ctx, n, db.name, db.url)
		if err != nil {
			return nil, fmt.Errorf("sweep on %s: %w", db.name, err)
		}
		say("  %s: rows written in %.1fs; sweeps took %v", db.name, r.FillSeconds, r.Seconds)
		out = append(out, r)
	}
	return out, nil
}

func measureSweep(ctx context.Context, n int, name, url string) (sweepResult, error) {
	res := sweepResult{Registry: name, Rows: n}
	reg, err := registry.Open(ctx, url, registry.Options{})
	if err != nil {
		return res, err
	}
	defer reg.Close()

	const owner = "bench-sweep"
	client := fake.NewClientset()
	informers := controller.NewInformers(client, controller.Scope{}, 0)
	ctrl, err := controller.New(ctx, client, informers, reg, &record.FakeRecorder{}, controller.Config{Owner: owner})
	if err != nil {
		return res, err
	}

	// The rows, from 8 writers (SQLite takes them one at a time, PostgreSQL side by side).
	fill := time.Now()
	err = inParallel(n, 8, func(i int) error {
		s := sweepStudent(i)
		if _, err := reg.Upsert(ctx, registry.Record{
			UID: string(s.UID), Namespace: s.Namespace, Name: s.Name,
			StudentName: s.Spec.Name, School: s.Spec.School, Owner: owner, Generation: s.Generation,
			DeletionPolicy: registry.PolicyDelete, // what the controller writes for a Student without one
		}, registry.Why{Cause: "test"}); err != nil {
			return err
		}
		return informers.Put(s)
	})
	if err != nil {
		return res, err
	}
	res.FillSeconds = time.Since(fill).Seconds()

	for range sweepRuns {
		start := time.Now()
		r, err := ctrl.Sweep(ctx)
		if err != nil {
			return res, err
		}
		res.Seconds = append(res.Seconds, time.Since(start).Seconds())
		if r.Rows != n || r.Resync != 0 || r.Orphans != 0 || r.Malformed != 0 {
			return res, fmt.Errorf("the sweep found %+v over %d rows in line, want every row compared and nothing to do", r, n)
		}
	}
	return res, nil
}

// sweepStudent is the i-th cached Student of the sweep measurement.
func sweepStudent(i int) *studentv1.Student {
	return &studentv1.Student{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "bench", Name: fmt.Sprintf("s-%06d", i), UID: types.UID(fmt.Sprintf("00000000-0000-0000-0000-%012d", i)),
			Generation: 1, Finalizers: []string{controller.Finalizer},
		},
		Spec: studentv1.StudentSpec{Name: fmt.Sprintf("学生 %d", i), School: "深圳中学"},
	}
}
