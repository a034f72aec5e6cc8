package registry

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/uuid"

	"github.com/student-controller/student-controller/internal/testenv/pgtest"
)

// BenchmarkWrite is one row write, an upsert of a new row, as the controller makes one
// per new Student: on SQLite with synchronous NORMAL (what the registry ran before) and
// FULL (now: every commit synced to disk), each unfenced and fenced (now: a transaction
// that ends with the fence check); on PostgreSQL (whose test server runs with
// fsync=off: only the round trips count) unfenced and fenced. `make bench-registry`
// runs it into bench/results/registry-writes.txt.
func BenchmarkWrite(b *testing.B) {
	ctx := context.Background()
	pg := pgtest.ForTest(b)
	databases := 0
	for _, tc := range []struct {
		name        string
		synchronous string // SQLite's, when set
		fenced      bool
	}{
		{"sqlite/synchronous=NORMAL", "NORMAL", false},
		{"sqlite/synchronous=FULL", "FULL", false},
		{"sqlite/synchronous=FULL,fenced", "FULL", true},
		{"postgres", "", false},
		{"postgres/fenced", "", true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			url := "sqlite://" + filepath.Join(b.TempDir(), "registry.db")
			if tc.synchronous == "" {
				databases++
				name := fmt.Sprintf("bench_%d", databases)
				if err := pg.CreateDatabase(ctx, name); err != nil {
					b.Fatal(err)
				}
				url = pg.URL(name, true)
			}
			// One connection, so that a PRAGMA holds for every write.
			r, err := Open(ctx, url, Options{MaxOpenConns: 1, MaxIdleConns: 1})
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close()
			if tc.synchronous != "" {
				if _, err := r.db.ExecContext(ctx, "PRAGMA synchronous = "+tc.synchronous); err != nil {
					b.Fatal(err)
				}
			}
			if tc.fenced {
				if _, err := r.TakeFence(ctx, "bench"); err != nil {
					b.Fatal(err)
				}
			}
			i := 0
			for b.Loop() {
				i++
				rec := Record{UID: fmt.Sprintf("uid-%d", i), Namespace: "default", Name: fmt.Sprintf("s-%d", i),
					StudentName: "张三", School: "深圳中学", Owner: "bench", Generation: 1, DeletionPolicy: PolicyDelete}
				if _, err := r.Upsert(ctx, rec, Why{Cause: "test"}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkWriteConcurrent is the controller's row writes as its 8 workers make them,
// 8 at once, on SQLite with synchronous FULL and the write fence held (as shipped):
// with group commit (as shipped: the writes waiting for the turn go in one
// transaction), and each in its own transaction, the writers waiting for one another
// in SQLite's busy handler (what the registry did before it had turns). The third case
// is the first on a registry that already holds 100000 rows and their history, as a
// converged N = 100000 does: what a row costs as the registry grows. ns/op is the time
// per row with 8 writing, so 1e9 / ns/op is rows per second. `make bench-registry` runs
// it into bench/results/registry-writes.txt.
func BenchmarkWriteConcurrent(b *testing.B) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		group bool
		rows  int
	}{
		{"sqlite/8-writers,group-commit", true, 0},
		{"sqlite/8-writers,busy-handler-only", false, 0},
		{"sqlite/8-writers,group-commit,100000-rows", true, 100000},
	} {
		b.Run(tc.name, func(b *testing.B) {
			r, err := Open(ctx, "sqlite://"+filepath.Join(b.TempDir(), "registry.db"), Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close()
			if err := prefill(ctx, r, tc.rows); err != nil {
				b.Fatal(err)
			}
			if _, err := r.TakeFence(ctx, "bench"); err != nil {
				b.Fatal(err)
			}
			if !tc.group {
				r.writer = nil // no turns: each write alone, SQLite's busy handler between them
			}
			newRowsAtOnce(b, func(rec Record) error {
				_, err := r.Upsert(ctx, rec, Why{Action: ActionCreated, Cause: CauseNewStudent})
				return err
			})
		})
	}
}

// BenchmarkNewStudentRow is what a new Student's sync asks of the registry, as the
// controller's 8 workers ask it, on SQLite as shipped (synchronous FULL, the write
// fence held, group commit): a Get that finds no row, then an upsert (the build
// before Insert), against an Insert alone (now). ns/op is the time per row with 8
// writing; cpu-ns/row is this process's CPU (user and system, from getrusage) per row,
// which on a machine whose cores are all busy comes out of kube-apiserver's share.
// `make bench-registry` runs it into bench/results/new-student-row.txt.
func BenchmarkNewStudentRow(b *testing.B) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		write func(r *Registry, rec Record) error
	}{
		{"sqlite/8-writers,get-then-upsert", func(r *Registry, rec Record) error {
			if _, err := r.Get(ctx, rec.UID); !errors.Is(err, ErrNotFound) {
				return fmt.Errorf("get of a new row: %w", err)
			}
			_, err := r.Upsert(ctx, rec, Why{Action: ActionCreated, Cause: CauseNewStudent})
			return err
		}},
		{"sqlite/8-writers,insert", func(r *Registry, rec Record) error {
			_, err := r.Insert(ctx, rec, CauseNewStudent)
			return err
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			r, err := Open(ctx, "sqlite://"+filepath.Join(b.TempDir(), "registry.db"), Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close()
			if _, err := r.TakeFence(ctx, "bench"); err != nil {
				b.Fatal(err)
			}
			cpu := cpuTime(b)
			newRowsAtOnce(b, func(rec Record) error { return tc.write(r, rec) })
			b.ReportMetric(float64(cpuTime(b)-cpu)/float64(b.N), "cpu-ns/row")
		})
	}
}

// newRowsAtOnce writes b.N new rows with write, 8 at once as the controller's workers
// write them, with random uids as the API server gives; the timer runs over the writes
// alone.
func newRowsAtOnce(b *testing.B, write func(Record) error) {
	const writers = 8
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for range writers {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				rec := Record{UID: string(uuid.NewUUID()), Namespace: "bench", Name: fmt.Sprintf("n-%06d", i),
					StudentName: "张三", School: "深圳中学", Owner: "bench", Generation: 1, DeletionPolicy: PolicyDelete}
				if err := write(rec); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
}

// cpuTime is the CPU this process has used so far, user and system.
func cpuTime(b *testing.B) time.Duration {
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		b.Fatal(err)
	}
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}

// prefill writes n rows of owner bench, with random uids as the API server gives, and
// their history rows, with the registry's own statements but in one transaction.
func prefill(ctx context.Context, r *Registry, n int) error {
	tx, err := r.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	now := time.Now().UTC()
	for i := range n {
		rec := Record{UID: string(uuid.NewUUID()), Namespace: "bench", Name: fmt.Sprintf("s-%05d", i),
			StudentName: fmt.Sprintf("学生 %d", i), School: "深圳中学", Owner: "bench", Generation: 1, DeletionPolicy: PolicyDelete}
		// The values Upsert and its history row write, from the same helpers, so that a
		// column added to either is added here too.
		var created, updated time.Time
		if err := tx.StmtContext(ctx, r.upsert).QueryRowContext(ctx, append(rowValues(rec, now), optional(rec.StudentUID))...).
			Scan(&created, &updated); err != nil {
			return err
		}
		if _, err := tx.StmtContext(ctx, r.history).ExecContext(ctx, entryOf(rec, ActionCreated, CauseNewStudent).values(now, "bench")...); err != nil {
			return err
		}
	}
	return tx.Commit()
}
