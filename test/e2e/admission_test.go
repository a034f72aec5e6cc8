package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/student-controller/student-controller/internal/controller"
	"github.com/student-controller/student-controller/internal/testenv"
	"github.com/student-controller/student-controller/internal/testenv/registrytest"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// TestAdmissionPolicy: with config/admission's policy (as the harness installs it, as
// config/default does) a new Student costs the controller exactly one Student write, its
// status, and one row write; without it, two Student writes (the finalizer, then status).
// Neither path sends an Event for a new Student or a deleted one (docs/design.md, Events).
// Either way a user's own finalizers are kept, and Students deleted while the
// controller is still catching up leave no row behind: with the policy at once, without
// it once the sweep has run. (Without the policy, a delete that races the controller's
// finalizer update can remove the Student anyway, kubernetes/kubernetes#77988, after
// its row was written; seen here. Such a row is released: no longer owned, kept.)
func TestAdmissionPolicy(t *testing.T) {
	t.Run("installed", func(t *testing.T) { testAdmissionPolicy(t, 1, 0) })
	t.Run("not installed", func(t *testing.T) {
		ctx := context.Background()
		if err := env.RemoveAdmissionPolicy(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := env.InstallAdmissionPolicy(ctx); err != nil {
				t.Errorf("reinstall the admission policy: %v", err)
			}
		})
		testAdmissionPolicy(t, 2, time.Second)
	})
}

func testAdmissionPolicy(t *testing.T, studentWrites int, sweep time.Duration) {
	const n = 30
	ns := testenv.Namespace(t, kubeClient(), "e2e-")
	url, db := registrytest.SQLiteBackend().New(t)
	ctl := startController(t, controllerOptions{registryURL: url, namespace: ns, sweepInterval: sweep})
	ctx := context.Background()

	// One of them with a user's own finalizer, to see it kept; one created with the
	// controller's finalizer already, to see it not added twice.
	const userFinalizer = "example.com/keep"
	kept := newStudent("kept", "深圳中学", "")
	kept.Finalizers = []string{userFinalizer}
	already := newStudent("already", "深圳中学", "")
	already.Finalizers = []string{controller.Finalizer}
	for _, s := range []*studentv1.Student{kept, already} {
		if _, err := students(ns).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	createMany(t, ns, n-2, "s")
	items := waitAllReady(t, ns, n, time.Minute)
	assertRowsMatch(t, db, items)
	for _, s := range items {
		want := []string{controller.Finalizer}
		if s.Name == "kept" {
			want = []string{userFinalizer, controller.Finalizer}
		}
		if !slices.Equal(want, s.Finalizers) {
			t.Errorf("%s: finalizers %v, want %v", s.Name, s.Finalizers, want)
		}
	}
	writes := ctl.requests.writes()
	// The one created with the finalizer costs its status write alone, either way.
	if got, want := writes["PUT students"]+writes["PATCH students"]+writes["PUT students/status"], 1+studentWrites*(n-1); got != want {
		t.Errorf("%d new Students cost %d Student writes, want %d (%d each but one): %v", n, got, want, studentWrites, writes)
	}
	if got := ctl.registry.writes.Load(); got != n {
		t.Errorf("%d new Students cost %d row writes, want one each", n, got)
	}

	// Students deleted at once, racing the controller, leave no row behind.
	createMany(t, ns, 10, "gone")
	for i := range 10 {
		if err := students(ns).Delete(ctx, fmt.Sprintf("gone-%03d", i), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	items = waitAllReady(t, ns, n, time.Minute)
	if sweep > 0 {
		eventually(t, 30*time.Second, "the sweep to release the rows of Students gone", func(context.Context) (bool, error) {
			owned := 0
			for _, r := range rowsOf(t, db) {
				if r.Owner != "" {
					owned++
				}
			}
			return owned == n, nil
		})
	}
	assertRowsMatch(t, db, items)
	// Events are sent in the background: by now, seconds after the first syncs, any
	// would have been.
	if got := ctl.requests.writes()["POST events"]; got != 0 {
		t.Errorf("%d Events for Students created and deleted, want none: %v", got, ctl.requests.writes())
	}
}
