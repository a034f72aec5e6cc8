package controller

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/student-controller/student-controller/internal/registry"
	"github.com/student-controller/student-controller/internal/testenv/registrytest"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// TestSweepSkipsMalformedRows: rows that another writer put past the schema's checks
// under this controller's owner mark are skipped, logged once and counted; the sweep
// still deletes the orphan and queues the Student whose row went missing.
func TestSweepSkipsMalformedRows(t *testing.T) {
	f := newFixture(t, newStudent("a"), newStudent("b"))
	for _, r := range []registry.Record{recordOf(owner, newStudent("a")), recordOf(owner, newStudent("gone"))} {
		if _, err := f.registry.Upsert(f.ctx, r, registry.Why{Cause: "test"}); err != nil {
			t.Fatal(err)
		}
	}
	wrong, err := registrytest.WriteMalformed(f.ctx, f.rawDB(), "sqlite", owner)
	if err != nil {
		t.Fatal(err)
	}
	metrics := NewMetrics(nil)

	for sweep := range 2 {
		got, err := f.ctrl.Sweep(f.ctx)
		metrics.observeSweep(got, err, time.Second)
		if err != nil {
			t.Fatalf("sweep %d: %v", sweep, err)
		}
		want := SweepResult{Rows: 2, Resync: 1, Orphans: 1, Released: 1, Malformed: len(wrong)}
		if sweep == 1 {
			want = SweepResult{Rows: 1, Resync: 1, Malformed: len(wrong)} // b's row is still missing: nothing synced it
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("sweep %d result (-want +got):\n%s", sweep, diff)
		}
		if n := testutil.ToFloat64(metrics.malformedRows); n != float64(len(wrong)) {
			t.Errorf("sweep %d: student_controller_registry_malformed_rows = %v, want %d", sweep, n, len(wrong))
		}
	}
	if row, ok := f.rows()["uid-gone"]; !ok || row.Owner != "" {
		t.Errorf("the orphan row: %+v, %v; want it kept, released", row, ok)
	}
	// Each malformed row is logged once, with its uid, over both sweeps.
	logs := f.logged()
	for uid := range wrong {
		n := 0
		for _, line := range logs {
			if strings.Contains(line, "Registry row cannot be read") && strings.Contains(line, "uid "+uid+" ") {
				n++
			}
		}
		if n != 1 {
			t.Errorf("malformed row %q logged %d times, want once; logs:\n%s", uid, n, strings.Join(logs, "\n"))
		}
	}
	// They are left as they were: not this controller's to delete.
	var n int
	if err := f.rawDB().QueryRowContext(f.ctx, `SELECT count(*) FROM students WHERE uid IN ('bad-generation', 'bad-time', 'bad-blob', '')`).Scan(&n); err != nil || n != len(wrong) {
		t.Errorf("malformed rows left: %d, %v; want %d", n, err, len(wrong))
	}
}

// TestSyncRewritesMalformedRow: a live Student whose own row another writer broke gets
// it rewritten by its next sync, and is Ready again.
func TestSyncRewritesMalformedRow(t *testing.T) {
	s := newStudent("a", withFinalizer)
	f := newFixture(t, s)
	if err := f.ctrl.sync(f.ctx, "school/a"); err != nil {
		t.Fatal(err)
	}
	f.observe("school", "a")
	conn, err := f.rawDB().Conn(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := registrytest.BypassChecks(f.ctx, conn, "sqlite"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(f.ctx, "UPDATE students SET generation = 'three', created_at = 'sometime' WHERE uid = 'uid-a'"); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	if _, err := f.registry.Get(f.ctx, "uid-a"); !errors.Is(err, registry.ErrMalformed) {
		t.Fatalf("Get after the break: %v, want ErrMalformed", err)
	}

	if err := f.ctrl.sync(f.ctx, "school/a"); err != nil {
		t.Fatalf("sync over the malformed row: %v", err)
	}
	got, err := f.registry.Get(f.ctx, "uid-a")
	if err != nil {
		t.Fatalf("row after the sync: %v", err)
	}
	ignoreTimes := cmpopts.IgnoreFields(registry.Record{}, "CreatedAt", "UpdatedAt")
	if diff := cmp.Diff(recordOf(owner, s), got, ignoreTimes); diff != "" || got.CreatedAt.IsZero() {
		t.Errorf("row after the sync (-want +got):\n%s", diff)
	}
	if !slices.Contains(f.events(), "Normal "+EventRowUpdated) {
		t.Errorf("no %s Event for the rewrite", EventRowUpdated)
	}
	if c := f.get("school", "a").Status.Conditions; len(c) != 1 || c[0].Reason != studentv1.ReasonSynced {
		t.Errorf("conditions after the rewrite: %+v", c)
	}
}

// TestFinalizeOrphanInvalidSpecMalformedRow: an Orphan Student whose spec the registry
// cannot hold (stored before the CRD refused it) is deleted while another writer has
// broken its row. Its values cannot be kept as last written, so the row is released
// as it stands, and the deletion finishes instead of retrying for ever.
func TestFinalizeOrphanInvalidSpecMalformedRow(t *testing.T) {
	s := newStudent("a", orphan, withFinalizer, synced(start), deleting, func(s *studentv1.Student) { s.Spec.Name = "a\x00b" })
	f := newFixture(t, s)
	f.put(recordOf(owner, newStudent("a", orphan)))
	conn, err := f.rawDB().Conn(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := registrytest.BypassChecks(f.ctx, conn, "sqlite"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(f.ctx, "UPDATE students SET generation = 'three' WHERE uid = 'uid-a'"); err != nil {
		t.Fatal(err)
	}
	conn.Close()

	if err := f.ctrl.sync(f.ctx, "school/a"); err != nil {
		t.Fatalf("finalize: %v, want the deletion to finish", err)
	}
	if got := f.get("school", "a"); slices.Contains(got.Finalizers, Finalizer) {
		t.Errorf("the finalizer is still on the Student: %v", got.Finalizers)
	}
	var owned string
	if err := f.rawDB().QueryRowContext(f.ctx, "SELECT coalesce(owner, '') FROM students WHERE uid = 'uid-a'").Scan(&owned); err != nil || owned != "" {
		t.Errorf("the row: owner %q, %v; want it kept, released", owned, err)
	}
}
