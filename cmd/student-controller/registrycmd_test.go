package main

import (
	"bytes"
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/student-controller/student-controller/internal/registry"
)

// TestRegistryCommandsKeepTheSchema: rename-owner changes no schema unasked. On a
// registry of the schema before this program's it refuses, saying --migrate, and
// changes nothing; with --migrate it migrates, then renames.
func TestRegistryCommandsKeepTheSchema(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "registry.db")
	url := "sqlite://" + path
	r, err := registry.Open(ctx, url, registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Upsert(ctx, registry.Record{UID: "u1", Namespace: "default", Name: "a", StudentName: "张三", School: "深圳中学", Owner: "old", Generation: 1},
		registry.Why{Cause: registry.CauseNewStudent}); err != nil {
		t.Fatal(err)
	}
	r.Close()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// The schema before the history (migrations 4 and 5).
	if _, err := db.Exec(`DROP TABLE student_history; ALTER TABLE fences DROP COLUMN holder; ALTER TABLE fences DROP COLUMN expires_at; ALTER TABLE fences DROP COLUMN mark; ALTER TABLE students DROP COLUMN student_uid; DELETE FROM schema_migrations WHERE version >= 4`); err != nil {
		t.Fatal(err)
	}
	state := func() (version int, owner string) {
		t.Helper()
		if err := db.QueryRow(`SELECT MAX(version) FROM schema_migrations`).Scan(&version); err != nil {
			t.Fatal(err)
		}
		if err := db.QueryRow(`SELECT owner FROM students WHERE uid = 'u1'`).Scan(&owner); err != nil {
			t.Fatal(err)
		}
		return version, owner
	}

	args := []string{"rename-owner", "--registry", url, "--registry-owner", "old", "--to", "new"}
	var stdout, stderr bytes.Buffer
	if code := registryCommand(ctx, args, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "--migrate") {
		t.Errorf("rename-owner on an older schema: exit %d, %q; want 1 and a word of --migrate", code, stderr.String())
	}
	if version, owner := state(); version != 3 || owner != "old" {
		t.Errorf("after the refusal: schema %d, owner %q; want 3 and old, unchanged", version, owner)
	}

	stdout.Reset()
	stderr.Reset()
	if code := registryCommand(ctx, append(args, "--migrate"), &stdout, &stderr); code != 0 {
		t.Fatalf("rename-owner --migrate: exit %d: %s", code, stderr.String())
	}
	if version, owner := state(); version != registry.LatestSchema() || owner != "new" {
		t.Errorf("after rename-owner --migrate: schema %d, owner %q; want %d and new", version, owner, registry.LatestSchema())
	}

	// backup copies whatever schema it finds, and says what the copy holds.
	stdout.Reset()
	to := filepath.Join(t.TempDir(), "backup.db")
	if code := registryCommand(ctx, []string{"backup", "--registry", url, "--to", to}, &stdout, &stderr); code != 0 ||
		!strings.Contains(stdout.String(), "(1 rows, 1 history rows)") {
		t.Errorf("backup: exit %d, %q (%s); want 0 and what the copy holds", code, stdout.String(), stderr.String())
	}
}

// TestRegistryCommandsRefuseWhileAControllerHoldsTheFence: a subcommand that writes
// for an owner takes the owner's write fence first; while a live controller of the
// owner holds it, it refuses, names the holder and changes nothing. Once the fence is
// given back it goes ahead.
func TestRegistryCommandsRefuseWhileAControllerHoldsTheFence(t *testing.T) {
	ctx := context.Background()
	url := "sqlite://" + filepath.Join(t.TempDir(), "registry.db")
	ctl, err := registry.Open(ctx, url, registry.Options{Actor: "the-controller", LeaseDuration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	if _, err := ctl.Upsert(ctx, registry.Record{UID: "u1", Namespace: "default", Name: "a", StudentName: "张三", School: "深圳中学", Owner: "old", Generation: 1},
		registry.Why{Cause: registry.CauseNewStudent}); err != nil {
		t.Fatal(err)
	}
	if _, err := ctl.TakeFence(ctx, "old"); err != nil {
		t.Fatal(err)
	}
	args := []string{"rename-owner", "--registry", url, "--registry-owner", "old", "--to", "new"}
	var stdout, stderr bytes.Buffer
	if code := registryCommand(ctx, args, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), ctl.Holder()) ||
		!strings.Contains(stderr.String(), "Nothing was changed") {
		t.Errorf("rename-owner while a controller holds the fence: exit %d, %q; want 1, naming %s", code, stderr.String(), ctl.Holder())
	}
	if row, err := ctl.Get(ctx, "u1"); err != nil || row.Owner != "old" {
		t.Errorf("the row after the refusal: %+v, %v; want it old's still", row, err)
	}
	if err := ctl.ReleaseFence(ctx); err != nil {
		t.Fatal(err)
	}
	stdout.Reset()
	stderr.Reset()
	if code := registryCommand(ctx, args, &stdout, &stderr); code != 0 {
		t.Errorf("rename-owner once the fence is given back: exit %d, %q", code, stderr.String())
	}
	if row, err := ctl.Get(ctx, "u1"); err != nil || row.Owner != "new" {
		t.Errorf("the row after rename-owner: %+v, %v; want it new's", row, err)
	}
	// The fence went to the new owner free: its controller takes it at once.
	if _, err := ctl.TakeFence(ctx, "new"); err != nil {
		t.Errorf("the new owner's fence after rename-owner: %v, want it free", err)
	}
}
