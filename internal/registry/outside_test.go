package registry_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/student-controller/student-controller/internal/registry"
	"github.com/student-controller/student-controller/internal/testenv/pgtest"
	"github.com/student-controller/student-controller/internal/testenv/registrytest"
)

// testSchemaChecks: the schema refuses rows the registry could not read, and the rows
// that got in anyway (before the checks, or past them) are left out of List, reported
// with their uid, and rewritten, released or deleted by their owner like any other.
func testSchemaChecks(t *testing.T, b registrytest.Backend) {
	ctx := context.Background()
	url, db := b.New(t)
	r := open(t, url, newFakeClock())

	for what, insert := range registrytest.Refused(b.Name) {
		if _, err := db.ExecContext(ctx, insert); err == nil {
			t.Errorf("the schema took a row with %s: %s", what, insert)
		}
	}

	for _, uid := range []string{"good-1", "good-2"} {
		if _, err := r.Upsert(ctx, student(uid, "ctl"), registry.Why{Cause: "test"}); err != nil {
			t.Fatal(err)
		}
	}
	wrong, err := registrytest.WriteMalformed(ctx, db, b.Name, "ctl")
	if err != nil {
		t.Fatal(err)
	}

	rows, malformed, err := r.List(ctx, "ctl")
	if err != nil {
		t.Fatalf("List with malformed rows: %v", err)
	}
	if len(rows) != 2 || rows[0].UID != "good-1" || rows[1].UID != "good-2" {
		t.Errorf("List returned %+v, want the two good rows", rows)
	}
	reported := map[string]string{}
	for _, m := range malformed {
		reported[m.UID] = m.Problem
	}
	if len(reported) != len(wrong) {
		t.Errorf("List reported malformed rows %v, want %d: %v", reported, len(wrong), wrong)
	}
	for uid, column := range wrong {
		if !strings.Contains(reported[uid], column) {
			t.Errorf("malformed row %q: problem %q does not name column %s", uid, reported[uid], column)
		}
	}

	// The owner's writes repair what the checks would refuse: an upsert rewrites the
	// row, a release keeps it readable, a delete deletes it. An insert leaves it.
	var uids []string
	for uid := range wrong {
		if uid != "" {
			uids = append(uids, uid)
		}
	}
	slices.Sort(uids)
	for i, uid := range uids {
		if _, err := r.Get(ctx, uid); !errors.Is(err, registry.ErrMalformed) || !strings.Contains(err.Error(), uid) {
			t.Errorf("Get(%s) = %v, want ErrMalformed naming the uid", uid, err)
		}
		rec := student(uid, "ctl")
		switch i % 3 {
		case 0:
			if _, err := r.Insert(ctx, rec, "test"); !errors.Is(err, registry.ErrExists) {
				t.Errorf("Insert over malformed row %s: %v, want ErrExists", uid, err)
			}
			if _, err := r.Get(ctx, uid); !errors.Is(err, registry.ErrMalformed) {
				t.Errorf("row %s after the Insert: %v, want it as it was (malformed)", uid, err)
			}
			if _, err := r.Upsert(ctx, rec, registry.Why{Cause: "test"}); err != nil {
				t.Errorf("Upsert over malformed row %s: %v", uid, err)
			}
			got, err := r.Get(ctx, uid)
			if err != nil || got.StudentName != rec.StudentName || got.Generation != rec.Generation || got.CreatedAt.IsZero() {
				t.Errorf("row %s after Upsert: %+v, %v", uid, got, err)
			}
		case 1:
			if released, err := r.Release(ctx, rec, "test"); err != nil || !released {
				t.Errorf("Release of malformed row %s: %v, %v", uid, released, err)
			}
			if got, err := r.Get(ctx, uid); err != nil || got.Owner != "" || got.ReleasedAt.IsZero() {
				t.Errorf("row %s after Release: %+v, %v", uid, got, err)
			}
		case 2:
			// Deleted where its policy column says Delete, else released as it stands.
			if outcome, err := r.Delete(ctx, uid, "ctl", "test"); err != nil || outcome == registry.Absent {
				t.Errorf("Delete of malformed row %s: %q, %v", uid, outcome, err)
			}
		}
	}
	// Another owner's malformed row stays as it is.
	if _, err := r.Upsert(ctx, student("", "other"), registry.Why{Cause: "test"}); err == nil {
		t.Error("Upsert of an empty uid succeeded")
	}
}

// TestSQLiteShellReadsTimes: the sqlite3 shell's date functions read every stored time
// and they sort as text in time order, in a new registry and in one migrated from the
// form the controller wrote before (Go's time.Time.String()).
func TestSQLiteShellReadsTimes(t *testing.T) {
	ctx := context.Background()
	old := filepath.Join(t.TempDir(), "old.db")
	db, err := sql.Open("sqlite", "file:"+old)
	if err != nil {
		t.Fatal(err)
	}
	atSchemaOne(t, db, "sqlite", "2026-11-29 07:59:59.5 +0000 UTC",
		// What the controller wrote until now, and what another program might have.
		`INSERT INTO students (uid, namespace, name, student_name, school, owner, generation, created_at, updated_at, released_at) VALUES ('u1', 'default', 'a', 'A', 'S', 'ctl', 1,
			'2026-11-29 08:00:01.803903461 +0000 UTC', '2026-11-29 08:00:02 +0000 UTC', NULL)`,
		`INSERT INTO students (uid, namespace, name, student_name, school, owner, generation, created_at, updated_at, released_at) VALUES ('u2', 'default', 'b', 'B', 'S', NULL, 1,
			'2026-11-29 09:00:03.25 +0100 CET', '2026-11-29T08:00:04Z', '2026-11-29 08:00:04')`,
		`INSERT INTO students (uid, namespace, name, student_name, school, owner, generation, created_at, updated_at, released_at) VALUES ('u3', 'default', 'c', 'C', 'S', 'ctl', 'three', 'sometime', '2026-11-29 08:00:05 +0000 UTC', NULL)`,
	)
	db.Close()

	r := open(t, "sqlite://"+old, newFakeClock())
	if _, err := r.Upsert(ctx, student("u4", "ctl"), registry.Why{Cause: "test"}); err != nil {
		t.Fatal(err)
	}
	got, err := registrytest.SQLite(ctx, old, `
		SELECT uid, datetime(created_at), datetime(updated_at), coalesce(datetime(released_at), '-'),
		       round((julianday(updated_at) - julianday(created_at)) * 86400)
		FROM students ORDER BY updated_at;
		SELECT version, datetime(applied_at) = applied_at FROM schema_migrations ORDER BY applied_at;
		SELECT uid, action, datetime(at) = at, round((julianday(at) - julianday('2026-11-29 08:00:00')) * 86400) FROM student_history`)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Join([]string{
		"u1|2026-11-29 08:00:01|2026-11-29 08:00:02|-|1.0",
		// Written now, by the fake clock: its first tick went to the migration.
		"u4|2026-11-29 08:00:02|2026-11-29 08:00:02|-|0.0",
		"u2|2026-11-29 08:00:03|2026-11-29 08:00:04|2026-11-29 08:00:04|1.0",
		// Kept as it was: the registry reports it and does not read it.
		"u3||2026-11-29 08:00:05|-|",
		"1|1", "2|1", "3|1", "4|1", "5|1", "6|1", "7|1", "8|1", "9|1", "10|1",
		// Its history row, stamped as the row was, in the same form.
		"u4|updated|1|2.0",
	}, "\n")
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("sqlite3 read (-want +got):\n%s", diff)
	}
	if rec, err := r.Get(ctx, "u2"); err != nil || !rec.CreatedAt.Equal(time.Date(2026, 11, 29, 8, 0, 3, 0, time.UTC)) {
		t.Errorf("the registry reads the migrated row u2 as %+v, %v", rec, err)
	}
	if _, err := r.Get(ctx, "u3"); !errors.Is(err, registry.ErrMalformed) {
		t.Errorf("Get(u3) = %v, want ErrMalformed", err)
	}
}

// TestPostgresShellReadsMigratedTimes: psql's date arithmetic reads the times of a
// registry written at schema version 1 and then migrated, and of rows written since.
func TestPostgresShellReadsMigratedTimes(t *testing.T) {
	ctx := context.Background()
	url, db := registrytest.NewDatabase(t, pgtest.ForTest(t))
	atSchemaOne(t, db, "postgres", "2026-11-29 07:59:59.5+00",
		`INSERT INTO students (uid, namespace, name, student_name, school, owner, generation, created_at, updated_at, released_at) VALUES ('u1', 'default', 'a', 'A', 'S', 'ctl', 1, '2026-11-29 08:00:01.8+00', '2026-11-29 09:00:02+01', NULL)`)
	r := open(t, url, newFakeClock())
	if _, err := r.Upsert(ctx, student("u2", "ctl"), registry.Why{Cause: "test"}); err != nil {
		t.Fatal(err)
	}
	got, err := registrytest.PSQL(ctx, url, `
		SELECT uid, to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS'),
		       extract(epoch FROM date_trunc('second', updated_at) - date_trunc('second', created_at))
		FROM students ORDER BY updated_at;
		SELECT version, applied_at < now() FROM schema_migrations ORDER BY applied_at;
		SELECT uid, action, extract(epoch FROM at - '2026-11-29 08:00:00+00') FROM student_history`)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Join([]string{
		"u1|2026-11-29 08:00:01|1.000000",
		"u2|2026-11-29 08:00:02|0.000000",
		"1|t", "2|t", "3|t", "4|t", "5|t", "6|t", "7|t", "8|t", "9|t", "10|t",
		"u2|updated|2.000000",
	}, "\n")
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("psql read (-want +got):\n%s", diff)
	}
}

// atSchemaOne makes db a registry as schema version 1 left it, recorded as applied at
// appliedAt, holding the rows that inserts write.
func atSchemaOne(t *testing.T, db *sql.DB, database, appliedAt string, inserts ...string) {
	t.Helper()
	schema, err := os.ReadFile(filepath.Join("migrations", database, "0001_students.sql"))
	if err != nil {
		t.Fatal(err)
	}
	timestamp := map[string]string{"sqlite": "TIMESTAMP", "postgres": "TIMESTAMPTZ"}[database]
	for _, stmt := range append([]string{
		string(schema),
		`CREATE TABLE schema_migrations (version INTEGER NOT NULL PRIMARY KEY, name TEXT NOT NULL, applied_at ` + timestamp + ` NOT NULL)`,
		`INSERT INTO schema_migrations VALUES (1, '0001_students.sql', '` + appliedAt + `')`,
	}, inserts...) {
		if _, err := db.Exec(stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
}
