package registry

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	_ "modernc.org/sqlite"
)

// TestWritesTakeTurns: a SQLite registry's writes from many goroutines at once take
// turns in the process (Registry.writer) and all land, each with its history row; a
// write waiting for its turn gives up with its context and writes nothing.
func TestWritesTakeTurns(t *testing.T) {
	ctx := context.Background()
	r, err := Open(ctx, "sqlite://"+filepath.Join(t.TempDir(), "registry.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.writer == nil {
		t.Fatal("a writable SQLite registry has no turn to take")
	}
	record := func(i int) Record {
		return Record{UID: fmt.Sprintf("uid-%d", i), Namespace: "default", Name: fmt.Sprintf("s-%d", i),
			StudentName: "张三", School: "深圳中学", Owner: "test", Generation: 1, DeletionPolicy: PolicyDelete}
	}

	const writers, each = 16, 25
	var wg sync.WaitGroup
	errs := make(chan error, writers*each)
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				if _, err := r.Upsert(ctx, record(w*each+i), Why{Cause: "test"}); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("a concurrent write failed: %v", err)
	}
	rows, malformed, err := r.List(ctx, "test")
	if err != nil || len(rows) != writers*each || len(malformed) != 0 {
		t.Fatalf("List: %d rows, %d malformed, %v; want %d rows", len(rows), len(malformed), err, writers*each)
	}
	if writeHistory {
		var history int
		if err := r.db.QueryRowContext(ctx, `SELECT count(*) FROM student_history`).Scan(&history); err != nil || history != writers*each {
			t.Fatalf("%d history rows (%v), want %d", history, err, writers*each)
		}
	}

	// Another write of this process holds the turn: a write that may wait 200 ms gives
	// up with its context's error, and its row is not there.
	r.writer <- struct{}{}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	started := time.Now()
	_, err = r.Upsert(short, record(-1), Why{Cause: "test"})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Upsert while the turn is held: %v, want context.DeadlineExceeded", err)
	}
	if waited := time.Since(started); waited > 2*time.Second {
		t.Errorf("Upsert gave up after %v, its context allowed 200 ms", waited)
	}
	<-r.writer
	if _, err := r.Get(ctx, record(-1).UID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get of the write that gave up: %v, want ErrNotFound", err)
	}
	if _, err := r.Upsert(ctx, record(-1), Why{Cause: "test"}); err != nil {
		t.Fatalf("Upsert once the turn is free: %v", err)
	}
}

// TestReadOnlyTakesNoTurn: a read-only registry never writes, and takes no turn.
func TestReadOnlyTakesNoTurn(t *testing.T) {
	ctx := context.Background()
	url := "sqlite://" + filepath.Join(t.TempDir(), "registry.db")
	w, err := Open(ctx, url, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	r, err := Open(ctx, url, Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.writer != nil {
		t.Error("a read-only registry has a turn to take")
	}
}

// TestSQLitePool: a SQLite registry keeps at most four connections, all of them when
// idle, unless told otherwise; each connection's page cache lives outside Go's heap
// and grows with the file.
func TestSQLitePool(t *testing.T) {
	ctx := context.Background()
	url := "sqlite://" + filepath.Join(t.TempDir(), "registry.db")
	for _, tc := range []struct {
		opts Options
		want int
	}{
		{Options{}, 4},
		{Options{MaxOpenConns: 2}, 2},
		{Options{ReadOnly: true}, 4},
	} {
		r, err := Open(ctx, url, tc.opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Close() })
		// Hold more connections than the pool may open: the last waits for one back.
		var conns []*sql.Conn
		for range tc.want {
			c, err := r.db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			conns = append(conns, c)
		}
		short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		if c, err := r.db.Conn(short); err == nil {
			_ = c.Close()
			t.Errorf("%+v: a connection beyond %d opened", tc.opts, tc.want)
		}
		cancel()
		for _, c := range conns {
			_ = c.Close()
		}
		if idle := r.db.Stats().Idle; idle != tc.want && tc.opts.MaxOpenConns == 0 {
			t.Errorf("%+v: %d connections kept idle, want all %d", tc.opts, idle, tc.want)
		}
	}
}

// TestListSortsNoTable: SQLite reads only the owner's rows for List, from the owner
// index, and does not sort them in a temporary B-tree, whose memory (4 MB for 100000
// rows) lives outside Go's heap and stays with the process; List sorts them itself, as
// an ORDER BY namespace, name, uid would.
func TestListSortsNoTable(t *testing.T) {
	ctx := context.Background()
	r, err := Open(ctx, "sqlite://"+filepath.Join(t.TempDir(), "registry.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	rows, err := r.db.QueryContext(ctx, `EXPLAIN QUERY PLAN `+sqlite.listOwned, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, detail)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if want := []string{"SEARCH students USING INDEX students_owner (owner=?)"}; !slices.Equal(plan, want) {
		t.Errorf("List's plan %q, want %q", plan, want)
	}

	// Names, namespaces and uids that sort differently by bytes and by other rules:
	// case, a dash, a digit, non-ASCII.
	records := []Record{
		{UID: "b", Namespace: "ns", Name: "a-b"}, {UID: "a", Namespace: "ns", Name: "a-b"},
		{UID: "c", Namespace: "ns", Name: "ab"}, {UID: "d", Namespace: "ns", Name: "a0"},
		{UID: "e", Namespace: "Ns", Name: "z"}, {UID: "f", Namespace: "ns", Name: "é"},
		{UID: "g", Namespace: "n", Name: "z"}, {UID: "h", Namespace: "ns", Name: "A"},
	}
	for _, rec := range records {
		rec.StudentName, rec.School, rec.Owner, rec.Generation = "s", "x", "test", 1
		if _, err := r.Upsert(ctx, rec, Why{Cause: "test"}); err != nil {
			t.Fatal(err)
		}
	}
	var want []string
	rows, err = r.db.QueryContext(ctx, `SELECT uid FROM students WHERE owner = 'test' ORDER BY namespace, name, uid`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var uid string
		if err := rows.Scan(&uid); err != nil {
			t.Fatal(err)
		}
		want = append(want, uid)
	}
	listed, malformed, err := r.List(ctx, "test")
	if err != nil || len(malformed) != 0 {
		t.Fatal(malformed, err)
	}
	var got []string
	for _, rec := range listed {
		got = append(got, rec.UID)
	}
	if !slices.Equal(got, want) || len(got) != len(records) {
		t.Errorf("List's order %q, want SQLite's ORDER BY namespace, name, uid: %q", got, want)
	}
}
