package chaos

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/student-controller/student-controller/internal/testenv/registrytest"
)

// TestGenerationWatcher runs the watcher on a table of its own and reads it while it
// runs, as the chaos run does (under the race detector, that read once raced with the
// watcher).
func TestGenerationWatcher(t *testing.T) {
	db := registrytest.OpenSQLite(t, filepath.Join(t.TempDir(), "rows.db"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, stmt := range []string{
		`CREATE TABLE students (uid TEXT PRIMARY KEY, namespace TEXT, name TEXT, student_name TEXT,
			school TEXT, owner TEXT, generation INTEGER, updated_at TEXT, released_at TEXT, release_cause TEXT)`,
		`INSERT INTO students VALUES ('u1', 'ns', 'a', 'A', 'S', 'o', 3, NULL, NULL, NULL)`,
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	d := &database{}
	d.p.Store(db)
	w := &generationWatcher{db: d}
	done := make(chan struct{})
	go func() { defer close(done); w.run(ctx, time.Millisecond) }()
	defer func() { cancel(); <-done }() // the watcher ends before the database closes
	waitReads := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); w.count() < n; {
			if time.Now().After(deadline) {
				t.Fatalf("the watcher read the registry %d times in 10s, want at least %d", w.count(), n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitReads(3)
	if p := w.problems(); len(p) != 0 {
		t.Fatalf("problems before any row went back: %v", p)
	}
	// A backup put back while the watcher is paused: the rows go back, and the
	// watcher starts again from them.
	w.pause()
	if _, err := db.ExecContext(ctx, `UPDATE students SET generation = 1 WHERE uid = 'u1'`); err != nil {
		t.Fatal(err)
	}
	w.resume()
	waitReads(w.count() + 3)
	if p := w.problems(); len(p) != 0 {
		t.Fatalf("problems after a restore while paused: %v", p)
	}
	if _, err := db.ExecContext(ctx, `UPDATE students SET generation = 3 WHERE uid = 'u1'`); err != nil {
		t.Fatal(err)
	}
	waitReads(w.count() + 3)
	if _, err := db.ExecContext(ctx, `UPDATE students SET generation = 2 WHERE uid = 'u1'`); err != nil {
		t.Fatal(err)
	}
	waitReads(w.count() + 3)
	p := w.problems() // one entry for each read that saw the row behind
	if len(p) == 0 {
		t.Fatal("no problem found, want the row that went from generation 3 to 2")
	}
	for _, s := range p {
		if !strings.Contains(s, "row u1 (ns/a) went from generation 3 to 2") {
			t.Fatalf("problem %q, want the row that went from generation 3 to 2", s)
		}
	}
}
