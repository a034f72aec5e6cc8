package e2e

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/student-controller/student-controller/internal/registry"
	"github.com/student-controller/student-controller/internal/testenv"
	"github.com/student-controller/student-controller/internal/testenv/ctrlbin"
	"github.com/student-controller/student-controller/internal/testenv/registrytest"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// TestUpgradeAndRollback: the previous release fills a registry and a cluster (Delete
// and Orphan Students, some deleted); this build then runs on the same registry and
// CRD, as a rolling update runs it: a standby beside the previous release, which
// leads, it leaves the schema alone; once it leads it migrates the schema, keeps every
// row, writes none again, and creates and deletes as before. The previous release, started again on the migrated registry,
// refuses it, says why, and writes nothing.
func TestUpgradeAndRollback(t *testing.T) {
	ctx := context.Background()
	old := buildAt(t, testenv.PreviousRelease)
	ns := testenv.Namespace(t, kubeClient(), "e2e-")
	client := students(ns)
	path := filepath.Join(t.TempDir(), "registry.db")
	leaseRBAC(t, ns)
	args := []string{"--kubeconfig", controllerID.Kubeconfig, "--namespace", ns, "--registry", "sqlite://" + path,
		"--registry-owner", owner, "--sweep-interval", "2s",
		"--leader-elect", "--sqlite-shared-file", "--leader-elect-namespace", ns}

	before := startBinary(t, "previous-release", old, nil, args...)
	uids := createAll(t, client, map[string]studentv1.DeletionPolicy{"d1": "Delete", "d2": "Delete", "o1": "Orphan", "o2": "Orphan"})
	waitAllReady(t, ns, 4, time.Minute)
	for _, name := range []string{"d2", "o2"} {
		if err := client.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitAllReady(t, ns, 2, time.Minute)
	db := registrytest.OpenSQLite(t, path)
	if v := schemaVersion(t, db); v != testenv.PreviousSchema {
		t.Fatalf("the previous release left schema %d, want %d", v, testenv.PreviousSchema)
	}
	rowsBefore := sqliteRows(t, db)
	written := map[string]string{}
	for uid := range rowsBefore {
		written[uid] = updatedAt(t, db, uid)
	}
	if len(rowsBefore) != 3 || rowsBefore[uids["o2"]].owner != "" {
		t.Fatalf("the previous release's rows: %+v; want d1, o1 and o2 released", rowsBefore)
	}

	// The upgrade, rolling: this build stands by while the previous release leads, and
	// leaves the schema alone; it migrates once it leads.
	after := startProcess(t, "this-build", args...)
	waitFor(t, 30*time.Second, "this build ready as a standby", func() bool {
		code, _, _ := get("http://" + after.ProbeAddr + "/readyz")
		return code == 200
	})
	time.Sleep(3 * time.Second)
	if v := schemaVersion(t, db); v != testenv.PreviousSchema {
		t.Fatalf("a standby of this build migrated the registry to schema %d under the previous release's leader", v)
	}
	stop(t, before)
	waitAllReady(t, ns, 2, time.Minute)
	newest := registry.LatestSchema()
	eventually(t, 30*time.Second, fmt.Sprintf("schema %d", newest), func(context.Context) (bool, error) { return schemaVersion(t, db) == newest, nil })
	// Two sweeps later nothing was written again: every row as it was.
	time.Sleep(5 * time.Second)
	for uid, r := range rowsBefore {
		if got := sqliteRows(t, db)[uid]; got != r || updatedAt(t, db, uid) != written[uid] {
			t.Errorf("row %s after the upgrade: %+v written %s; want %+v written %s, untouched", uid, got, updatedAt(t, db, uid), r, written[uid])
		}
	}
	created, err := client.Create(ctx, newStudent("n1", "school A", ""), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Delete(ctx, "d1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRows(t, db, "n1's row written and d1's deleted", func(rows map[string]row) bool {
		_, d1 := rows[uids["d1"]]
		return !d1 && rows[string(created.UID)] == row{owner, "school A", 1}
	})
	waitAllReady(t, ns, 2, time.Minute)
	stop(t, after)

	// The rollback: the previous release refuses the migrated registry.
	rowsAfter, history := sqliteRows(t, db), historyCount(t, db)
	back := startBinary(t, "previous-release-again", old, nil, args...)
	exited, err := back.Wait(time.Minute)
	if !exited {
		t.Fatal("the previous release did not exit on a registry of a newer schema")
	}
	if err == nil || !strings.Contains(back.Output(), "newer than this controller knows") {
		t.Errorf("the previous release on schema %d: exit %v; want a failure naming the newer schema:\n%s", newest, err, back.Output())
	}
	if got := sqliteRows(t, db); len(got) != len(rowsAfter) || historyCount(t, db) != history {
		t.Errorf("the previous release wrote: %d rows and %d history rows, were %d and %d", len(got), historyCount(t, db), len(rowsAfter), history)
	}
}

// buildAt builds the controller of commit from this repository's history.
func buildAt(t *testing.T, commit string) string {
	t.Helper()
	src := t.TempDir()
	if err := testenv.Archive(env.Root, commit, src); err != nil {
		t.Fatal(err)
	}
	bin, err := ctrlbin.Build{Root: src, Out: filepath.Join(t.TempDir(), "student-controller")}.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// stop ends a controller with SIGTERM and waits for its drain.
func stop(t *testing.T, p *process) {
	t.Helper()
	p.signal(syscall.SIGTERM)
	if err := p.wait(45 * time.Second); err != nil {
		t.Fatalf("%s's exit: %v", p.Name(), err)
	}
}

// schemaVersion is the registry's schema version.
func schemaVersion(t *testing.T, db *sql.DB) int {
	t.Helper()
	var v int
	if err := db.QueryRow(`SELECT MAX(version) FROM schema_migrations`).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// historyCount is how many history rows the registry holds.
func historyCount(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM student_history`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
