package registry_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/student-controller/student-controller/internal/registry"
	"github.com/student-controller/student-controller/internal/testenv/pgtest"
	"github.com/student-controller/student-controller/internal/testenv/registrytest"
)

// fakeClock hands out times one second apart, so that every write's stamp differs.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(time.Second)
	return c.now
}

// newURL makes a fresh, empty registry of b's kind and returns its URL.
func newURL(t *testing.T, b registrytest.Backend) string {
	t.Helper()
	url, _ := b.New(t)
	return url
}

func TestRegistry(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) { runSuite(t, registrytest.SQLiteBackend()) })
	t.Run("postgres", func(t *testing.T) { runSuite(t, registrytest.PostgresBackend(pgtest.ForTest(t))) })
}

func open(t *testing.T, url string, clock *fakeClock) *registry.Registry {
	t.Helper()
	return openWith(t, url, registry.Options{Now: clock.Now})
}

func openWith(t *testing.T, url string, opts registry.Options) *registry.Registry {
	t.Helper()
	r, err := registry.Open(context.Background(), url, opts)
	if err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func student(uid, owner string) registry.Record {
	return registry.Record{
		UID: uid, Namespace: "default", Name: "zhang-san-" + uid,
		StudentName: "张三", School: "深圳中学", Owner: owner, Generation: 1,
	}
}

// runSuite is the registry's behaviour, the same on every backend.
func runSuite(t *testing.T, b registrytest.Backend) {
	ctx := context.Background()

	// A new row, as the controller writes it (Insert) and as an upsert does.
	for name, write := range map[string]func(*registry.Registry, registry.Record) (registry.Record, error){
		"Insert": func(r *registry.Registry, rec registry.Record) (registry.Record, error) {
			return r.Insert(ctx, rec, registry.CauseNewStudent)
		},
		"Upsert": func(r *registry.Registry, rec registry.Record) (registry.Record, error) {
			return r.Upsert(ctx, rec, registry.Why{Cause: "test"})
		},
	} {
		t.Run(name+" of a new row, then read back", func(t *testing.T) {
			r := open(t, newURL(t, b), newFakeClock())
			want := student("u1", "ctl")
			want.DeletionPolicy = registry.PolicyOrphan
			stored, err := write(r, want)
			if err != nil {
				t.Fatal(err)
			}
			want.CreatedAt = time.Date(2026, 11, 29, 8, 0, 2, 0, time.UTC) // the first tick went to the migration
			want.UpdatedAt = want.CreatedAt
			if diff := cmp.Diff(want, stored); diff != "" {
				t.Errorf("%s returned (-want +got):\n%s", name, diff)
			}
			got, err := r.Get(ctx, "u1")
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("Get returned (-want +got):\n%s", diff)
			}
			if _, err := r.Get(ctx, "nope"); !errors.Is(err, registry.ErrNotFound) {
				t.Errorf("Get of a missing row: %v, want ErrNotFound", err)
			}
		})
	}

	t.Run("insert writes only a row that is not there", func(t *testing.T) {
		r := open(t, newURL(t, b), newFakeClock())
		want := student("u1", "ctl")
		if _, err := r.Insert(ctx, want, registry.CauseNewStudent); err != nil {
			t.Fatal(err)
		}
		// Over a row of the same owner, of another, and a released one: ErrExists,
		// and each row as it was.
		changed := want
		changed.School, changed.Generation = "北京四中", 2
		if _, err := r.Insert(ctx, changed, registry.CauseNewStudent); !errors.Is(err, registry.ErrExists) {
			t.Errorf("Insert over the owner's row: %v, want ErrExists", err)
		}
		if got, _ := r.Get(ctx, "u1"); got.School != "深圳中学" || got.Generation != 1 {
			t.Errorf("the owner's row after an Insert over it: %+v, want it as first written", got)
		}
		if _, err := r.Upsert(ctx, student("theirs", "other"), registry.Why{Cause: "test"}); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Insert(ctx, student("theirs", "ctl"), registry.CauseNewStudent); !errors.Is(err, registry.ErrExists) {
			t.Errorf("Insert over another owner's row: %v, want ErrExists", err)
		}
		if released, err := r.Release(ctx, want, "test"); err != nil || !released {
			t.Fatalf("Release: %v, %v", released, err)
		}
		if _, err := r.Insert(ctx, want, registry.CauseNewStudent); !errors.Is(err, registry.ErrExists) {
			t.Errorf("Insert over a released row: %v, want ErrExists", err)
		}
		if got, _ := r.Get(ctx, "u1"); got.Owner != "" || got.School != "深圳中学" || got.Generation != 1 {
			t.Errorf("released row after the Inserts: %+v, want it as released", got)
		}
		if got, _ := r.Get(ctx, "theirs"); got.Owner != "other" {
			t.Errorf("another owner's row after the Insert: %+v", got)
		}
	})

	t.Run("update by owner keeps created_at", func(t *testing.T) {
		r := open(t, newURL(t, b), newFakeClock())
		first, err := r.Upsert(ctx, student("u1", "ctl"), registry.Why{Cause: "test"})
		if err != nil {
			t.Fatal(err)
		}
		changed := student("u1", "ctl")
		changed.School, changed.Generation = "北京四中", 2
		second, err := r.Upsert(ctx, changed, registry.Why{Cause: "test"})
		if err != nil {
			t.Fatal(err)
		}
		got, _ := r.Get(ctx, "u1")
		if got.School != "北京四中" || got.Generation != 2 {
			t.Errorf("row after update: %+v", got)
		}
		if !got.CreatedAt.Equal(first.CreatedAt) || !got.UpdatedAt.After(first.UpdatedAt) || !got.UpdatedAt.Equal(second.UpdatedAt) {
			t.Errorf("timestamps: first %+v, second %+v, stored %+v", first, second, got)
		}
	})

	t.Run("a row never goes back in generation", func(t *testing.T) {
		r := open(t, newURL(t, b), newFakeClock())
		at := func(gen int64, school string) registry.Record {
			rec := student("u1", "ctl")
			rec.Generation, rec.School = gen, school
			return rec
		}
		if _, err := r.Upsert(ctx, at(3, "北京四中"), registry.Why{Cause: "test"}); err != nil {
			t.Fatal(err)
		}
		// A former leader's stale sync, and its stale release: refused, row kept.
		if _, err := r.Upsert(ctx, at(2, "深圳中学"), registry.Why{Cause: "test"}); !errors.Is(err, registry.ErrStale) {
			t.Errorf("Upsert of generation 2 over 3: %v, want ErrStale", err)
		}
		if released, err := r.Release(ctx, at(1, "深圳中学"), "test"); !errors.Is(err, registry.ErrStale) || released {
			t.Errorf("Release of generation 1 over 3: %v, %v, want ErrStale", released, err)
		}
		if got, _ := r.Get(ctx, "u1"); got.Generation != 3 || got.School != "北京四中" || got.Owner != "ctl" {
			t.Errorf("row after stale writes: %+v, want generation 3 as written", got)
		}
		// The same generation again (a repair) and a newer one go ahead.
		if _, err := r.Upsert(ctx, at(3, "北京四中"), registry.Why{Cause: "test"}); err != nil {
			t.Errorf("rewrite at the same generation: %v", err)
		}
		if _, err := r.Upsert(ctx, at(4, "上海中学"), registry.Why{Cause: "test"}); err != nil {
			t.Errorf("write of a newer generation: %v", err)
		}

		// Writers racing with every generation from 5 to 40, in no order: the row only
		// ever moves forward, and ends at the newest.
		var wg sync.WaitGroup
		for g := int64(40); g >= 5; g-- {
			wg.Go(func() {
				if _, err := r.Upsert(ctx, at(g, fmt.Sprintf("school %d", g)), registry.Why{Cause: "test"}); err != nil && !errors.Is(err, registry.ErrStale) {
					t.Errorf("generation %d: %v", g, err)
				}
			})
		}
		var seen []int64
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		for watching := true; watching; {
			select {
			case <-done:
				watching = false
			default:
			}
			if got, err := r.Get(ctx, "u1"); err == nil {
				if n := len(seen); n > 0 && got.Generation < seen[n-1] {
					t.Errorf("the row went back from generation %d to %d", seen[n-1], got.Generation)
				}
				seen = append(seen, got.Generation)
			}
		}
		if got, _ := r.Get(ctx, "u1"); got.Generation != 40 || got.School != "school 40" {
			t.Errorf("row after the race: generation %d, school %q; want 40, school 40", got.Generation, got.School)
		}
	})

	t.Run("other owners are never changed", func(t *testing.T) {
		r := open(t, newURL(t, b), newFakeClock())
		theirs, err := r.Upsert(ctx, student("u1", "someone-else"), registry.Why{Cause: "test"})
		if err != nil {
			t.Fatal(err)
		}
		mine := student("u1", "ctl")
		mine.School = "北京四中"
		if _, err := r.Upsert(ctx, mine, registry.Why{Cause: "test"}); !errors.Is(err, registry.ErrNotOwned) {
			t.Errorf("Upsert over another owner's row: %v, want ErrNotOwned", err)
		}
		if outcome, err := r.Delete(ctx, "u1", "ctl", "test"); !errors.Is(err, registry.ErrNotOwned) || outcome != registry.Absent {
			t.Errorf("Delete of another owner's row: %q, %v, want ErrNotOwned", outcome, err)
		}
		if released, err := r.Release(ctx, mine, "test"); !errors.Is(err, registry.ErrNotOwned) || released {
			t.Errorf("Release of another owner's row: %v, %v, want ErrNotOwned", released, err)
		}
		got, _ := r.Get(ctx, "u1")
		if diff := cmp.Diff(theirs, got); diff != "" {
			t.Errorf("another owner's row changed (-want +got):\n%s", diff)
		}
	})

	t.Run("delete destroys only a row that records Delete, and releases any other", func(t *testing.T) {
		r := open(t, newURL(t, b), newFakeClock())
		want := map[string]registry.Outcome{"d": registry.Deleted, "o": registry.Released, "unknown": registry.Released}
		for uid, policy := range map[string]string{"d": registry.PolicyDelete, "o": registry.PolicyOrphan, "unknown": ""} {
			rec := student(uid, "ctl")
			rec.DeletionPolicy = policy
			if _, err := r.Upsert(ctx, rec, registry.Why{Cause: "test"}); err != nil {
				t.Fatal(err)
			}
			if got, err := r.Delete(ctx, uid, "ctl", registry.CauseFinalizer); err != nil || got != want[uid] {
				t.Fatalf("Delete %s: %q, %v, want %q", uid, got, err, want[uid])
			}
			row, err := r.Get(ctx, uid)
			switch want[uid] {
			case registry.Deleted:
				if !errors.Is(err, registry.ErrNotFound) {
					t.Errorf("row %s still there after Delete: %+v, %v", uid, row, err)
				}
			case registry.Released:
				if err != nil || row.Owner != "" || row.DeletionPolicy != policy || row.ReleasedBy != "ctl" ||
					row.ReleaseCause != registry.CauseFinalizer || registry.Prunable(row, "ctl") {
					t.Errorf("row %s after Delete: %+v, %v; want it released as it stood, by ctl, not prunable", uid, row, err)
				}
			}
		}
		// A delete is idempotent: once more is no error and deletes nothing.
		if got, err := r.Delete(ctx, "d", "ctl", "test"); err != nil || got != registry.Absent {
			t.Errorf("second Delete: %q, %v, want nothing, nil", got, err)
		}
	})

	t.Run("release", func(t *testing.T) {
		r := open(t, newURL(t, b), newFakeClock())
		written, err := r.Upsert(ctx, student("u1", "ctl"), registry.Why{Cause: "test"})
		if err != nil {
			t.Fatal(err)
		}
		last := student("u1", "ctl")
		last.School, last.Generation = "北京四中", 2
		if released, err := r.Release(ctx, last, "test"); err != nil || !released {
			t.Fatalf("Release: %v, %v, want true, nil", released, err)
		}
		got, err := r.Get(ctx, "u1")
		if err != nil {
			t.Fatal(err)
		}
		// The released row keeps the Student's last spec, and when it was first written.
		want := last
		want.Owner, want.CreatedAt = "", written.CreatedAt
		want.UpdatedAt, want.ReleasedAt = got.ReleasedAt, got.ReleasedAt
		want.DeletionPolicy = registry.PolicyOrphan
		want.ReleasedBy, want.ReleaseCause = "ctl", "test"
		if diff := cmp.Diff(want, got); diff != "" || got.ReleasedAt.IsZero() {
			t.Errorf("released row (-want +got):\n%s", diff)
		}
		// Released means no controller changes it again, its old owner included.
		if _, err := r.Upsert(ctx, student("u1", "ctl"), registry.Why{Cause: "test"}); !errors.Is(err, registry.ErrNotOwned) {
			t.Errorf("Upsert over a released row: %v, want ErrNotOwned", err)
		}
		if _, err := r.Delete(ctx, "u1", "ctl", "test"); !errors.Is(err, registry.ErrNotOwned) {
			t.Errorf("Delete of a released row: %v, want ErrNotOwned", err)
		}
		if released, err := r.Release(ctx, student("missing", "ctl"), "test"); err != nil || released {
			t.Errorf("Release of a missing row: %v, %v, want false, nil", released, err)
		}
		if rows, _, _ := r.List(ctx, "ctl"); len(rows) != 0 {
			t.Errorf("List shows released rows: %+v", rows)
		}
	})

	t.Run("rewind takes a row ahead back to its Student, and nothing else", func(t *testing.T) {
		r := open(t, newURL(t, b), newFakeClock())
		ahead := student("u1", "ctl")
		ahead.School, ahead.Generation = "school D", 4
		written, err := r.Upsert(ctx, ahead, registry.Why{Cause: "test"})
		if err != nil {
			t.Fatal(err)
		}
		// The Student after an etcd restore: generation 2, which Upsert refuses.
		back := student("u1", "ctl")
		back.School, back.Generation = "school E", 2
		if _, err := r.Upsert(ctx, back, registry.Why{Cause: "test"}); !errors.Is(err, registry.ErrStale) {
			t.Fatalf("Upsert of an older generation: %v, want ErrStale", err)
		}
		// Found at another generation than the caller read: nothing changes, and the
		// caller is told to read again, not that the row is stale.
		if _, err := r.Rewind(ctx, back, 3); err == nil || errors.Is(err, registry.ErrStale) {
			t.Errorf("Rewind from a generation the row does not hold: %v, want an error to try again", err)
		}
		if _, err := r.Rewind(ctx, student("other", "ctl"), 4); !errors.Is(err, registry.ErrNotFound) {
			t.Errorf("Rewind of a missing row: %v, want ErrNotFound", err)
		}
		if _, err := r.Rewind(ctx, func() registry.Record { x := back; x.Owner = "another"; return x }(), 4); !errors.Is(err, registry.ErrNotOwned) {
			t.Errorf("Rewind as another owner: %v, want ErrNotOwned", err)
		}
		got, err := r.Rewind(ctx, back, 4)
		if err != nil {
			t.Fatal(err)
		}
		stored, err := r.Get(ctx, "u1")
		if err != nil {
			t.Fatal(err)
		}
		want := back
		want.CreatedAt, want.UpdatedAt = written.CreatedAt, got.UpdatedAt
		if diff := cmp.Diff(want, stored); diff != "" {
			t.Errorf("rewound row (-want +got):\n%s", diff)
		}
		h, err := r.History(ctx, back.Namespace, back.Name)
		if err != nil {
			t.Fatal(err)
		}
		if last := h[len(h)-1]; len(h) != 2 || last.Action != registry.ActionUpdated || last.Cause != registry.CauseRegistryAhead || last.Generation != 2 {
			t.Errorf("history %+v, want the upsert's row and then one updated/%s at generation 2", h, registry.CauseRegistryAhead)
		}
		// From there on the row is monotonic again.
		if _, err := r.Upsert(ctx, student("u1", "ctl"), registry.Why{Cause: "test"}); !errors.Is(err, registry.ErrStale) {
			t.Errorf("Upsert of generation 1 after the rewind: %v, want ErrStale", err)
		}
	})

	t.Run("list by owner", func(t *testing.T) {
		r := open(t, newURL(t, b), newFakeClock())
		for _, rec := range []registry.Record{student("b", "ctl"), student("a", "ctl"), student("c", "other")} {
			if _, err := r.Upsert(ctx, rec, registry.Why{Cause: "test"}); err != nil {
				t.Fatal(err)
			}
		}
		rows, malformed, err := r.List(ctx, "ctl")
		if err != nil || len(malformed) > 0 {
			t.Fatal(malformed, err)
		}
		var uids []string
		for _, row := range rows {
			uids = append(uids, row.UID)
		}
		if diff := cmp.Diff([]string{"a", "b"}, uids); diff != "" {
			t.Errorf("List(ctl) (-want +got):\n%s", diff)
		}
	})

	t.Run("reopen keeps rows and schema", func(t *testing.T) {
		url := newURL(t, b)
		r := open(t, url, newFakeClock())
		if _, err := r.Upsert(ctx, student("u1", "ctl"), registry.Why{Cause: "test"}); err != nil {
			t.Fatal(err)
		}
		r.Close()
		again := open(t, url, newFakeClock())
		if _, err := again.Get(ctx, "u1"); err != nil {
			t.Errorf("row lost across reopen: %v", err)
		}
	})

	t.Run("concurrent writers", func(t *testing.T) {
		url := newURL(t, b)
		// Two registries on one database, as two processes would be, each with workers.
		regs := []*registry.Registry{open(t, url, newFakeClock()), open(t, url, newFakeClock())}
		const perWorker = 40
		var wg sync.WaitGroup
		errs := make(chan error, 2*4*perWorker)
		for i, r := range regs {
			for w := range 4 {
				wg.Go(func() {
					for n := range perWorker {
						rec := student(fmt.Sprintf("r%d-w%d-%d", i, w, n), fmt.Sprintf("ctl-%d", i))
						if _, err := r.Upsert(ctx, rec, registry.Why{Cause: "test"}); err != nil {
							errs <- err
						}
						rec.School = "updated"
						if _, err := r.Upsert(ctx, rec, registry.Why{Cause: "test"}); err != nil {
							errs <- err
						}
					}
				})
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("concurrent write: %v", err)
		}
		for i, r := range regs {
			rows, _, err := r.List(ctx, fmt.Sprintf("ctl-%d", i))
			if err != nil {
				t.Fatal(err)
			}
			if len(rows) != 4*perWorker {
				t.Errorf("owner ctl-%d has %d rows, want %d", i, len(rows), 4*perWorker)
			}
			for _, row := range rows {
				if row.School != "updated" {
					t.Errorf("row %s lost its update: %+v", row.UID, row)
					break
				}
			}
		}
	})

	t.Run("concurrent open migrates once", func(t *testing.T) {
		url := newURL(t, b)
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for range 4 {
			wg.Go(func() {
				r, err := registry.Open(ctx, url, registry.Options{})
				if err == nil {
					r.Close()
				}
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Errorf("concurrent Open: %v", err)
			}
		}
		r := open(t, url, newFakeClock())
		if _, err := r.Upsert(ctx, student("u1", "ctl"), registry.Why{Cause: "test"}); err != nil {
			t.Errorf("Upsert after concurrent opens: %v", err)
		}
	})

	t.Run("schema checks and malformed rows", func(t *testing.T) { testSchemaChecks(t, b) })

	t.Run("unreachable database", func(t *testing.T) {
		url, db := b.New(t)
		r := open(t, url, newFakeClock())
		if _, err := r.Upsert(ctx, student("before", "ctl"), registry.Why{Cause: "test"}); err != nil {
			t.Fatal(err)
		}
		restore := b.Outage(t, db)
		_, err := r.Upsert(ctx, student("u1", "ctl"), registry.Why{Cause: "test"})
		if err == nil {
			restore()
			t.Fatal("Upsert succeeded while the database was out")
		}
		if errors.Is(err, registry.ErrNotOwned) || errors.Is(err, registry.ErrNotFound) {
			t.Errorf("an outage reads as %v", err)
		}
		restore()
		// Connections cut by the outage may fail once more; the controller retries.
		deadline := time.Now().Add(15 * time.Second)
		for {
			_, err := r.Upsert(ctx, student("u1", "ctl"), registry.Why{Cause: "test"})
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("Upsert after the outage: %v", err)
			}
			time.Sleep(200 * time.Millisecond)
		}
		if _, err := r.Get(ctx, "before"); err != nil {
			t.Errorf("a row written before the outage: %v", err)
		}
	})

	t.Run("the row records its deletion policy", func(t *testing.T) {
		r := open(t, newURL(t, b), newFakeClock())
		for uid, policy := range map[string]string{"d": registry.PolicyDelete, "o": registry.PolicyOrphan, "unknown": ""} {
			rec := student(uid, "ctl")
			rec.DeletionPolicy = policy
			if _, err := r.Upsert(ctx, rec, registry.Why{Cause: "test"}); err != nil {
				t.Fatal(err)
			}
			got, err := r.Get(ctx, uid)
			if err != nil || got.DeletionPolicy != policy {
				t.Errorf("row %s: policy %q, %v; want %q", uid, got.DeletionPolicy, err, policy)
			}
		}
	})

	t.Run("relinquish never deletes: it releases every row as it stands, Delete ones prunable", func(t *testing.T) {
		r := open(t, newURL(t, b), newFakeClock())
		want := map[string]registry.Outcome{"d": registry.Released, "o": registry.Released, "unknown": registry.Released}
		for uid, policy := range map[string]string{"d": registry.PolicyDelete, "o": registry.PolicyOrphan, "unknown": ""} {
			rec := student(uid, "ctl")
			rec.DeletionPolicy = policy
			if _, err := r.Upsert(ctx, rec, registry.Why{Cause: "test"}); err != nil {
				t.Fatal(err)
			}
			if _, err := r.Relinquish(ctx, uid, "other", "test"); !errors.Is(err, registry.ErrNotOwned) {
				t.Errorf("Relinquish %s by another owner: %v, want ErrNotOwned", uid, err)
			}
			got, err := r.Relinquish(ctx, uid, "ctl", registry.CauseSweep)
			if err != nil || got != want[uid] {
				t.Errorf("Relinquish %s: %q, %v; want %q", uid, got, err, want[uid])
			}
			row, err := r.Get(ctx, uid)
			if err != nil || row.Owner != "" || row.ReleasedAt.IsZero() || row.StudentName != rec.StudentName ||
				row.DeletionPolicy != policy || row.ReleasedBy != "ctl" || row.ReleaseCause != registry.CauseSweep {
				t.Errorf("row %s after release: %+v, %v; want it kept with its policy, released by ctl for the sweep", uid, row, err)
			}
			if prunable := registry.Prunable(row, "ctl"); prunable != (policy == registry.PolicyDelete) || registry.Prunable(row, "other") {
				t.Errorf("row %s: prunable by ctl %v; want it only where its policy is Delete, and never by another owner", uid, prunable)
			}
		}
		// Prune deletes the prunable row alone, once, on record.
		for uid, wantPruned := range map[string]bool{"d": true, "o": false, "unknown": false} {
			if pruned, err := r.Prune(ctx, uid, "other"); err != nil || pruned {
				t.Errorf("Prune %s by another owner: %v, %v; want nothing", uid, pruned, err)
			}
			if pruned, err := r.Prune(ctx, uid, "ctl"); err != nil || pruned != wantPruned {
				t.Errorf("Prune %s: %v, %v; want %v", uid, pruned, err, wantPruned)
			}
		}
		if _, err := r.Get(ctx, "d"); !errors.Is(err, registry.ErrNotFound) {
			t.Errorf("row d after Prune: %v, want it gone", err)
		}
		if h, err := r.History(ctx, "default", "zhang-san-d"); err != nil || len(h) == 0 || h[len(h)-1].Cause != registry.CausePrune {
			t.Errorf("history of d: %+v, %v; want it to end with the prune", h, err)
		}
		if got, err := r.Relinquish(ctx, "nope", "ctl", "test"); err != nil || got != registry.Absent {
			t.Errorf("Relinquish of a missing row: %q, %v", got, err)
		}
	})

	t.Run("take back: only the owner that released a row owns it again", func(t *testing.T) {
		r := open(t, newURL(t, b), newFakeClock())
		rec := student("u1", "ctl")
		rec.DeletionPolicy = registry.PolicyOrphan
		if _, err := r.Upsert(ctx, rec, registry.Why{Cause: "test"}); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Release(ctx, rec, registry.CauseFinalizer); err != nil {
			t.Fatal(err)
		}
		if _, err := r.TakeBack(ctx, student("u1", "other"), registry.CauseTakenBack); !errors.Is(err, registry.ErrNotOwned) {
			t.Errorf("TakeBack by another owner: %v, want ErrNotOwned", err)
		}
		rec.School, rec.Generation = "北京四中", 2
		got, err := r.TakeBack(ctx, rec, registry.CauseTakenBack)
		if err != nil || got.Owner != "ctl" || got.School != "北京四中" {
			t.Fatalf("TakeBack: %+v, %v", got, err)
		}
		row, err := r.Get(ctx, "u1")
		if err != nil || row.Owner != "ctl" || row.ReleasedBy != "" || row.ReleaseCause != "" || !row.ReleasedAt.IsZero() || row.Generation != 2 {
			t.Errorf("row after TakeBack: %+v, %v; want it owned again, at generation 2", row, err)
		}
		h, err := r.History(ctx, rec.Namespace, rec.Name)
		if n := len(h); err != nil || n < 2 || h[n-2].Cause != registry.CauseBeforeTakenBack || h[n-2].School != "深圳中学" ||
			h[n-1].Cause != registry.CauseTakenBack || h[n-1].School != "北京四中" {
			t.Errorf("history: %+v, %v; want the released row kept, then the take-back", h, err)
		}
		if _, err := r.TakeBack(ctx, rec, registry.CauseTakenBack); !errors.Is(err, registry.ErrNotOwned) {
			t.Errorf("TakeBack of an owned row: %v, want ErrNotOwned", err)
		}
		if _, err := r.TakeBack(ctx, student("missing", "ctl"), registry.CauseTakenBack); !errors.Is(err, registry.ErrNotFound) {
			t.Errorf("TakeBack of no row: %v, want ErrNotFound", err)
		}
	})

	t.Run("an observed row is never let go without its Student; a write manages it again", func(t *testing.T) {
		r := open(t, newURL(t, b), newFakeClock())
		for _, uid := range []string{"d", "o"} {
			rec := student(uid, "ctl")
			rec.DeletionPolicy = map[string]string{"d": registry.PolicyDelete, "o": registry.PolicyOrphan}[uid]
			if _, err := r.Upsert(ctx, rec, registry.Why{Cause: "test"}); err != nil {
				t.Fatal(err)
			}
			if err := r.MarkObserved(ctx, uid, "other"); !errors.Is(err, registry.ErrNotOwned) {
				t.Errorf("MarkObserved %s by another owner: %v, want ErrNotOwned", uid, err)
			}
			for range 2 { // the second finds it observed already
				if err := r.MarkObserved(ctx, uid, "ctl"); err != nil {
					t.Fatalf("MarkObserved %s: %v", uid, err)
				}
			}
			if got, err := r.Relinquish(ctx, uid, "ctl", registry.CauseSweep); !errors.Is(err, registry.ErrObserved) || got != registry.Absent {
				t.Errorf("Relinquish of observed row %s: %q, %v; want nothing done, ErrObserved", uid, got, err)
			}
			row, err := r.Get(ctx, uid)
			if err != nil || row.Owner != "ctl" || row.Management != registry.ManagementObserve || row.StudentName != rec.StudentName {
				t.Errorf("observed row %s after Relinquish: %+v, %v; want it as it was, observed", uid, row, err)
			}
			rec.Generation++
			if row, err = r.Upsert(ctx, rec, registry.Why{Cause: "test"}); err != nil || row.Management != "" {
				t.Fatalf("Upsert of observed row %s: %+v, %v; want it managed again", uid, row, err)
			}
			if row, err = r.Get(ctx, uid); err != nil || row.Management != "" {
				t.Errorf("row %s after Upsert: %+v, %v; want it managed", uid, row, err)
			}
		}
		d := student("d", "ctl")
		h, err := r.History(ctx, d.Namespace, d.Name)
		if err != nil || len(h) != 3 || h[1].Cause != registry.CauseObserved || h[1].Action != registry.ActionUpdated {
			t.Errorf("history of d: %+v, %v; want its write, observed once, its write", h, err)
		}
		if err := r.MarkObserved(ctx, "nope", "ctl"); err != nil {
			t.Errorf("MarkObserved of a missing row: %v", err)
		}
	})

	t.Run("adopt binds a released, an outside or the owner's row to a new Student, observed", func(t *testing.T) {
		url, db := b.New(t)
		r := open(t, url, newFakeClock())
		for uid, owner := range map[string]string{"mine": "ctl", "released": "ctl", "theirs": "other"} {
			rec := student(uid, owner)
			rec.Generation = 7
			if _, err := r.Upsert(ctx, rec, registry.Why{Cause: "test"}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := r.Relinquish(ctx, "released", "ctl", "test"); err != nil { // no policy recorded: released
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, `INSERT INTO students (uid, namespace, name, student_name, school) VALUES ('outside', 'default', 'li-si', '李四', '深圳中学')`); err != nil {
			t.Fatalf("a row with the five columns alone: %v", err)
		}
		all, malformed, err := r.ListAll(ctx)
		if err != nil || len(all) != 4 || len(malformed) != 0 {
			t.Fatalf("ListAll: %d rows, %v malformed, %v; want 4", len(all), malformed, err)
		}
		for _, from := range []string{"mine", "released", "outside"} {
			to := registry.Record{UID: "new-" + from, Namespace: "default", Name: "n-" + from, Owner: "ctl", Generation: 1, DeletionPolicy: registry.PolicyOrphan,
				Management: registry.ManagementObserve}
			if err := r.Adopt(ctx, from, to, registry.CauseAdopted); err != nil {
				t.Fatalf("Adopt %s: %v", from, err)
			}
			// The row keeps its key, the one another system writes it by, and records
			// its Student's uid.
			got, err := r.Get(ctx, from)
			if err != nil || got.Owner != "ctl" || got.Generation != 1 || got.Management != registry.ManagementObserve || !got.ReleasedAt.IsZero() ||
				got.DeletionPolicy != registry.PolicyOrphan || got.Name != to.Name || got.StudentUID != to.UID {
				t.Errorf("row of %s after Adopt: %+v, %v", from, got, err)
			}
			if _, err := r.Get(ctx, to.UID); !errors.Is(err, registry.ErrNotFound) {
				t.Errorf("a row of the Student's uid %s: %v, want none", to.UID, err)
			}
			h, err := r.History(ctx, "default", to.Name)
			if err != nil || len(h) == 0 || h[len(h)-1].Action != registry.ActionAdopted || h[len(h)-1].UID != from {
				t.Errorf("history of %s: %+v, %v; want it adopted last", from, h, err)
			}
		}
		if err := r.Adopt(ctx, "theirs", registry.Record{UID: "x", Namespace: "default", Name: "x", Owner: "ctl", Generation: 1}, registry.CauseAdopted); !errors.Is(err, registry.ErrNotOwned) {
			t.Errorf("Adopt of another owner's row: %v, want ErrNotOwned", err)
		}
		if err := r.Adopt(ctx, "nope", registry.Record{UID: "y", Namespace: "default", Name: "y", Owner: "ctl", Generation: 1}, registry.CauseAdopted); !errors.Is(err, registry.ErrNotFound) {
			t.Errorf("Adopt of a missing row: %v, want ErrNotFound", err)
		}
	})

	t.Run("an owner belongs to one cluster", func(t *testing.T) {
		url := newURL(t, b)
		r := open(t, url, newFakeClock())
		if _, err := r.Bind(ctx, "ctl", "cluster-a"); err != nil {
			t.Fatalf("first bind: %v", err)
		}
		if _, err := r.Bind(ctx, "ctl", "cluster-a"); err != nil {
			t.Errorf("bind again to the same cluster: %v", err)
		}
		if _, err := r.Bind(ctx, "other", "cluster-b"); err != nil {
			t.Errorf("another owner, another cluster: %v", err)
		}
		// Another process, as a second controller would be.
		r2 := open(t, url, newFakeClock())
		got, err := r2.Bind(ctx, "ctl", "cluster-b")
		if !errors.Is(err, registry.ErrOtherCluster) || got.Cluster != "cluster-a" {
			t.Errorf("bind to another cluster: %+v, %v; want ErrOtherCluster naming cluster-a", got, err)
		}
		// The controller's check before a sweep: the schema, then the binding.
		bind := registry.Op{Kind: registry.OpBind, Record: registry.Record{Owner: "ctl"}, Cluster: "cluster-b"}
		if res, err := r2.Apply(ctx, bind); !errors.Is(err, registry.ErrOtherCluster) || res.Binding.Cluster != "cluster-a" {
			t.Errorf("Apply bind to another cluster: %+v, %v; want ErrOtherCluster naming cluster-a", res, err)
		}
		if _, err := r2.Apply(ctx, registry.Op{Kind: registry.OpBind, Record: registry.Record{Owner: "ctl"}}); err != nil {
			t.Errorf("Apply bind without a cluster (the schema alone): %v", err)
		}
		if _, err := r2.MoveCluster(ctx, "ctl", "cluster-x", "cluster-b"); err == nil {
			t.Error("a move from a cluster the owner is not bound to succeeded")
		}
		if got, err := r2.MoveCluster(ctx, "ctl", "cluster-a", "cluster-b"); err != nil || got.Cluster != "cluster-b" {
			t.Errorf("move: %+v, %v", got, err)
		}
		if _, err := r2.Bind(ctx, "ctl", "cluster-b"); err != nil {
			t.Errorf("bind after the move: %v", err)
		}
		if _, err := r.Bind(ctx, "ctl", "cluster-a"); !errors.Is(err, registry.ErrOtherCluster) {
			t.Errorf("the old cluster after the move: %v, want ErrOtherCluster", err)
		}
	})

	t.Run("the write fence is a lease: held, renewed, run out, given back", func(t *testing.T) {
		url := newURL(t, b)
		const lease = 300 * time.Millisecond
		old := openWith(t, url, registry.Options{Now: newFakeClock().Now, Actor: "pod-old", LeaseDuration: lease})
		next := openWith(t, url, registry.Options{Now: newFakeClock().Now, Actor: "pod-next", LeaseDuration: lease})
		first, err := old.TakeFence(ctx, "ctl")
		if err != nil || first <= 0 {
			t.Fatalf("TakeFence: %d, %v; want a positive token", first, err)
		}
		if _, err := old.Upsert(ctx, student("u1", "ctl"), registry.Why{Cause: "test"}); err != nil {
			t.Fatal(err)
		}
		// A live holder keeps the fence: the next controller waits, and learns who holds it.
		_, err = next.TakeFence(ctx, "ctl")
		var held *registry.HeldError
		if !errors.As(err, &held) || !errors.Is(err, registry.ErrHeld) || held.Holder != old.Holder() || held.For <= 0 || held.For > lease {
			t.Fatalf("TakeFence while another holds it: %v; want a HeldError naming %s, for at most %v", err, old.Holder(), lease)
		}
		if !strings.HasPrefix(old.Holder(), "pod-old#") {
			t.Errorf("holder %q; want the actor and a suffix", old.Holder())
		}
		// Renewals keep it past its first expiry.
		for range 3 {
			time.Sleep(lease / 3)
			if err := old.RenewFence(ctx); err != nil {
				t.Fatalf("RenewFence: %v", err)
			}
		}
		if _, err := next.TakeFence(ctx, "ctl"); !errors.Is(err, registry.ErrHeld) {
			t.Fatalf("TakeFence of a renewed fence: %v; want ErrHeld", err)
		}
		// A holder that stops renewing (crashed, paused) loses it once the lease runs out.
		time.Sleep(lease + 100*time.Millisecond)
		tok, err := next.TakeFence(ctx, "ctl")
		if err != nil || tok <= 0 || tok == first {
			t.Fatalf("TakeFence after the lease ran out: %d, %v; want a positive token other than %d", tok, err, first)
		}
		if err := old.RenewFence(ctx); !errors.Is(err, registry.ErrFenced) {
			t.Errorf("RenewFence by the former holder: %v, want ErrFenced", err)
		}
		late := student("u1", "ctl")
		late.School, late.Generation = "a late write", 2
		if _, err := old.Upsert(ctx, late, registry.Why{Cause: "test"}); !errors.Is(err, registry.ErrFenced) {
			t.Errorf("Upsert by the fenced writer: %v, want ErrFenced", err)
		}
		if _, err := old.Delete(ctx, "u1", "ctl", "test"); !errors.Is(err, registry.ErrFenced) {
			t.Errorf("Delete by the fenced writer: %v, want ErrFenced", err)
		}
		if _, err := old.Release(ctx, late, "test"); !errors.Is(err, registry.ErrFenced) {
			t.Errorf("Release by the fenced writer: %v, want ErrFenced", err)
		}
		if _, err := old.Relinquish(ctx, "u1", "ctl", "test"); !errors.Is(err, registry.ErrFenced) {
			t.Errorf("Relinquish by the fenced writer: %v, want ErrFenced", err)
		}
		if _, err := old.PruneHistory(ctx, time.Now().Add(time.Hour)); !errors.Is(err, registry.ErrFenced) {
			t.Errorf("PruneHistory by the fenced writer: %v, want ErrFenced", err)
		}
		if _, err := old.Bind(ctx, "ctl", "cluster-a"); !errors.Is(err, registry.ErrFenced) {
			t.Errorf("Bind by the fenced writer: %v, want ErrFenced", err)
		}
		if _, err := next.BindingOf(ctx, "ctl"); !errors.Is(err, registry.ErrNotFound) {
			t.Errorf("the binding after the fenced Bind: %v, want none", err)
		}
		if _, err := old.TakeFence(ctx, "ctl"); !errors.Is(err, registry.ErrHeld) {
			t.Errorf("the former holder taking it back while the next holds it: %v, want ErrHeld", err)
		}
		if got, err := next.Get(ctx, "u1"); err != nil || got.School != "深圳中学" || got.Owner != "ctl" {
			t.Errorf("row after the fenced writes: %+v, %v; want it unchanged", got, err)
		}
		if _, err := next.Upsert(ctx, late, registry.Why{Cause: "test"}); err != nil {
			t.Errorf("Upsert by the fence's holder: %v", err)
		}
		// Given back, it is free at once; a write of the one that gave it back is rolled back.
		if err := next.ReleaseFence(ctx); err != nil {
			t.Fatalf("ReleaseFence: %v", err)
		}
		third := openWith(t, url, registry.Options{Now: newFakeClock().Now, Actor: "pod-third"})
		if _, err := third.TakeFence(ctx, "ctl"); err != nil {
			t.Fatalf("TakeFence after it was given back: %v", err)
		}
		late.Generation = 3
		if _, err := next.Upsert(ctx, late, registry.Why{Cause: "test"}); !errors.Is(err, registry.ErrFenced) {
			t.Errorf("Upsert after giving the fence back: %v, want ErrFenced", err)
		}
		// Another owner's fence is its own.
		if _, err := next.TakeFence(ctx, "other"); err != nil {
			t.Errorf("TakeFence of another owner: %v", err)
		}
	})

	t.Run("an owner renamed takes its rows and binding along", func(t *testing.T) {
		r := open(t, newURL(t, b), newFakeClock())
		for _, rec := range []registry.Record{student("u1", "old"), student("u2", "old"), student("u3", "taken")} {
			if _, err := r.Upsert(ctx, rec, registry.Why{Cause: "test"}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := r.Bind(ctx, "old", "cluster-a"); err != nil {
			t.Fatal(err)
		}
		if _, err := r.RenameOwner(ctx, "old", "taken"); err == nil {
			t.Error("renaming onto an owner with rows succeeded")
		}
		if n, err := r.RenameOwner(ctx, "old", "new"); err != nil || n != 2 {
			t.Fatalf("RenameOwner: %d, %v; want 2 rows", n, err)
		}
		if rows, _, err := r.List(ctx, "new"); err != nil || len(rows) != 2 {
			t.Errorf("rows of the new owner: %v, %v", rows, err)
		}
		if rows, _, _ := r.List(ctx, "old"); len(rows) != 0 {
			t.Errorf("rows left with the old owner: %v", rows)
		}
		if _, err := r.Bind(ctx, "new", "cluster-b"); !errors.Is(err, registry.ErrOtherCluster) {
			t.Errorf("the new owner's binding: %v, want it bound to cluster-a", err)
		}
		for _, uid := range []string{"u1", "u2"} {
			h, err := r.History(ctx, "default", "zhang-san-"+uid)
			if err != nil || len(h) != 2 || h[1].Action != registry.ActionAdopted || h[1].Owner != "new" || h[1].Cause != registry.CauseOwnerMove {
				t.Errorf("history of %s after the rename: %+v, %v; want its write, then adopted by new", uid, h, err)
			}
		}
	})

	t.Run("every write leaves one history row, in its transaction", func(t *testing.T) {
		url, db := b.New(t)
		clock := newFakeClock()
		r, err := registry.Open(ctx, url, registry.Options{Now: clock.Now, Actor: "pod-a"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		if _, err := r.TakeFence(ctx, "ctl"); err != nil {
			t.Fatal(err)
		}
		u1 := student("u1", "ctl")
		u1.DeletionPolicy = registry.PolicyDelete
		write := func(err error) {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
		}
		_, err = r.Insert(ctx, u1, registry.CauseNewStudent)
		write(err)
		u1.School, u1.Generation = "北京四中", 2
		_, err = r.Upsert(ctx, u1, registry.Why{Action: registry.ActionUpdated, Cause: registry.CauseSpecChange})
		write(err)
		// Refused writes leave no history: a row there already, stale, not owned,
		// nothing to delete.
		if _, err := r.Insert(ctx, u1, registry.CauseNewStudent); !errors.Is(err, registry.ErrExists) {
			t.Fatalf("insert over a row: %v", err)
		}
		stale := u1
		stale.Generation = 1
		if _, err := r.Upsert(ctx, stale, registry.Why{Cause: registry.CauseDrift}); !errors.Is(err, registry.ErrStale) {
			t.Fatalf("stale upsert: %v", err)
		}
		if _, err := r.Delete(ctx, "u1", "someone-else", registry.CauseFinalizer); !errors.Is(err, registry.ErrNotOwned) {
			t.Fatalf("delete as another owner: %v", err)
		}
		if outcome, err := r.Delete(ctx, "absent", "ctl", registry.CauseFinalizer); err != nil || outcome != registry.Absent {
			t.Fatalf("delete of no row: %q, %v", outcome, err)
		}
		_, err = r.Delete(ctx, "u1", "ctl", registry.CauseFinalizer)
		write(err)
		_, err = r.Upsert(ctx, u1, registry.Why{Action: registry.ActionRestored, Cause: registry.CauseRestore})
		write(err)
		outcome, err := r.Relinquish(ctx, "u1", "ctl", registry.CauseSweep)
		if err != nil || outcome != registry.Released {
			t.Fatalf("Relinquish: %v, %v", outcome, err)
		}
		u2 := student("u2", "ctl")
		u2.DeletionPolicy = registry.PolicyOrphan
		_, err = r.Upsert(ctx, u2, registry.Why{Action: registry.ActionCreated, Cause: registry.CauseNewStudent})
		write(err)
		_, err = r.Release(ctx, u2, registry.CauseFinalizer)
		write(err)
		// A row written before rows recorded their policy gets its Student's: on
		// record too, with the policy set.
		u4 := student("u4", "ctl")
		_, err = r.Upsert(ctx, u4, registry.Why{Action: registry.ActionCreated, Cause: registry.CauseNewStudent})
		write(err)
		write(r.RecordPolicy(ctx, "u4", "ctl", registry.PolicyOrphan))
		write(r.RecordPolicy(ctx, "u4", "ctl", registry.PolicyDelete)) // recorded already: nothing
		// A write rolled back by the fence leaves no history either.
		if err := r.ReleaseFence(ctx); err != nil {
			t.Fatal(err)
		}
		u3 := student("u3", "ctl")
		if _, err := r.Upsert(ctx, u3, registry.Why{Action: registry.ActionCreated, Cause: registry.CauseNewStudent}); !errors.Is(err, registry.ErrFenced) {
			t.Fatalf("fenced upsert: %v", err)
		}
		if _, err := r.Insert(ctx, u3, registry.CauseNewStudent); !errors.Is(err, registry.ErrFenced) {
			t.Fatalf("fenced insert: %v", err)
		}

		type step struct {
			Action, Cause, School string
			Generation            int64
			Policy                string // the deletion policy the write left the row with
		}
		const del, orphan = registry.PolicyDelete, registry.PolicyOrphan
		want := map[string][]step{
			"u1": {
				{registry.ActionCreated, registry.CauseNewStudent, "深圳中学", 1, del},
				{registry.ActionUpdated, registry.CauseSpecChange, "北京四中", 2, del},
				{registry.ActionDeleted, registry.CauseFinalizer, "北京四中", 2, del},
				{registry.ActionRestored, registry.CauseRestore, "北京四中", 2, del},
				{registry.ActionReleased, registry.CauseSweep, "北京四中", 2, del},
			},
			"u2": {
				{registry.ActionCreated, registry.CauseNewStudent, "深圳中学", 1, orphan},
				{registry.ActionReleased, registry.CauseFinalizer, "深圳中学", 1, orphan},
			},
			"u3": nil,
			"u4": {
				{registry.ActionCreated, registry.CauseNewStudent, "深圳中学", 1, ""},
				{registry.ActionUpdated, registry.CausePolicyRecorded, "深圳中学", 1, orphan},
			},
		}
		var last time.Time
		var lastID int64
		for uid, steps := range want {
			h, err := r.History(ctx, "default", "zhang-san-"+uid)
			if err != nil {
				t.Fatal(err)
			}
			var got []step
			for _, e := range h {
				got = append(got, step{e.Action, e.Cause, e.School, e.Generation, e.DeletionPolicy})
				if e.UID != uid || e.Owner != "ctl" || e.Actor != "pod-a" || e.StudentName != "张三" || e.At.IsZero() {
					t.Errorf("history row of %s: %+v; want its uid, the owner, the actor and the values written", uid, e)
				}
				if uid == "u1" && (e.ID <= lastID || e.At.Before(last)) {
					t.Errorf("history of u1 out of order: %+v after id %d at %v", e, lastID, last)
				}
				if uid == "u1" {
					last, lastID = e.At, e.ID
				}
			}
			if diff := cmp.Diff(steps, got); diff != "" {
				t.Errorf("history of %s (-want +got):\n%s", uid, diff)
			}
		}
		// The database's own date functions read the times.
		query := `SELECT count(*) FROM student_history WHERE datetime(at) IS NOT at`
		if b.Name == "postgres" {
			query = `SELECT count(*) FROM student_history WHERE NOT isfinite(at)`
		}
		var bad int
		if err := db.QueryRow(query).Scan(&bad); err != nil || bad != 0 {
			t.Errorf("history times the database cannot read: %d, %v", bad, err)
		}
	})

	t.Run("a registry opened read-only reads, and writes nothing", func(t *testing.T) {
		url, db := b.New(t)
		readOnly := func() (*registry.Registry, error) {
			return registry.Open(ctx, url, registry.Options{ReadOnly: true})
		}
		if r, err := readOnly(); !errors.Is(err, registry.ErrNoSchema) {
			if r != nil {
				r.Close()
			}
			t.Fatalf("read-only Open of a new registry: %v, want ErrNoSchema", err)
		}
		var tables int
		if err := db.QueryRow(map[string]string{
			"sqlite":   `SELECT count(*) FROM sqlite_master WHERE type = 'table'`,
			"postgres": `SELECT count(*) FROM information_schema.tables WHERE table_schema = current_schema()`,
		}[b.Name]).Scan(&tables); err != nil || tables != 0 {
			t.Errorf("tables after a read-only Open of a new registry: %d, %v; want none", tables, err)
		}

		w := open(t, url, newFakeClock())
		if _, err := w.Upsert(ctx, student("u1", "ctl"), registry.Why{Cause: registry.CauseNewStudent}); err != nil {
			t.Fatal(err)
		}
		if _, err := w.Bind(ctx, "ctl", "cluster-a"); err != nil {
			t.Fatal(err)
		}
		r, err := readOnly()
		if err != nil {
			t.Fatalf("read-only Open: %v", err)
		}
		defer r.Close()
		if row, err := r.Get(ctx, "u1"); err != nil || row.Owner != "ctl" {
			t.Errorf("Get: %+v, %v", row, err)
		}
		if rows, _, err := r.List(ctx, "ctl"); err != nil || len(rows) != 1 {
			t.Errorf("List: %d rows, %v; want 1", len(rows), err)
		}
		if b, err := r.BindingOf(ctx, "ctl"); err != nil || b.Cluster != "cluster-a" {
			t.Errorf("BindingOf: %+v, %v", b, err)
		}
		changed := student("u1", "ctl")
		changed.School, changed.Generation = "another school", 2
		if _, err := r.Upsert(ctx, changed, registry.Why{Cause: registry.CauseSpecChange}); err == nil {
			t.Error("Upsert through a read-only registry succeeded")
		}
		if _, err := r.Delete(ctx, "u1", "ctl", registry.CauseFinalizer); err == nil {
			t.Error("Delete through a read-only registry succeeded")
		}
		if _, err := r.Insert(ctx, student("u2", "ctl"), registry.CauseNewStudent); err == nil || errors.Is(err, registry.ErrExists) {
			t.Errorf("Insert through a read-only registry: %v, want it refused", err)
		}
		if _, err := r.Bind(ctx, "other", "cluster-b"); err == nil {
			t.Error("Bind through a read-only registry succeeded")
		}
		var school string
		var history int
		if err := db.QueryRow(`SELECT school FROM students WHERE uid = 'u1'`).Scan(&school); err != nil || school != "深圳中学" {
			t.Errorf("the row after writes through a read-only registry: school %q, %v", school, err)
		}
		var rows int
		if err := db.QueryRow(`SELECT count(*) FROM students`).Scan(&rows); err != nil || rows != 1 {
			t.Errorf("rows after writes through a read-only registry: %d, %v; want the one of the writable registry", rows, err)
		}
		if err := db.QueryRow(`SELECT count(*) FROM student_history`).Scan(&history); err != nil || history != 1 {
			t.Errorf("history rows: %d, %v; want the one of the writable registry", history, err)
		}

		// A schema older than this program's is not migrated by what only reads.
		var latest int
		if err := db.QueryRow(`SELECT MAX(version) FROM schema_migrations`).Scan(&latest); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(`DELETE FROM schema_migrations WHERE version = $1`, latest); err != nil {
			t.Fatal(err)
		}
		if r, err := readOnly(); err == nil || !strings.Contains(err.Error(), "older than this program's") {
			if r != nil {
				r.Close()
			}
			t.Errorf("read-only Open of an older schema: %v, want it refused", err)
		}
	})

	t.Run("the history is pruned in batches, the newer rows kept", func(t *testing.T) {
		url, db := b.New(t)
		r := open(t, url, newFakeClock())
		if _, err := r.Upsert(ctx, student("kept", "ctl"), registry.Why{Cause: registry.CauseNewStudent}); err != nil {
			t.Fatal(err)
		}
		tx, err := db.Begin()
		if err != nil {
			t.Fatal(err)
		}
		old := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
		for i := range 2500 {
			if _, err := tx.Exec(`INSERT INTO student_history (at, uid, action, owner, cause, actor) VALUES ($1, $2, 'deleted', 'ctl', 'sweep', 'test')`,
				old.Add(time.Duration(i)*time.Second).Format(time.DateTime), fmt.Sprintf("old-%d", i)); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		n, err := r.PruneHistory(ctx, time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
		if err != nil || n != 2500 {
			t.Errorf("PruneHistory: %d, %v; want the 2500 old rows", n, err)
		}
		var left int
		if err := db.QueryRow(`SELECT count(*) FROM student_history`).Scan(&left); err != nil || left != 1 {
			t.Errorf("history rows left: %d, %v; want the newer one", left, err)
		}
	})
}

func TestOpenErrors(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	tests := map[string]struct {
		url  string
		want string
	}{
		"no scheme":         {url: "registry.db", want: `want sqlite:///ABSOLUTE/PATH.db, sqlite:RELATIVE/PATH.db or postgres://USER@HOST:PORT/DATABASE`},
		"unknown scheme":    {url: "mysql://db/students", want: `unsupported scheme "mysql"`},
		"sqlite with host":  {url: "sqlite://host/registry.db", want: "a SQLite URL has no host"},
		"sqlite no file":    {url: "sqlite:///" + dir + "/", want: "names no file"},
		"sqlite parameters": {url: "sqlite:///" + dir + "/r.db?mode=ro", want: "SQLite URLs take no parameters"},
		"missing folder":    {url: "sqlite://" + dir + "/no/such/folder/r.db", want: "open registry sqlite://" + dir + "/no/such/folder/r.db"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r, err := registry.Open(ctx, tc.url, registry.Options{})
			if err == nil {
				r.Close()
				t.Fatalf("Open(%q) succeeded", tc.url)
			}
			if !contains(err.Error(), tc.want) {
				t.Errorf("Open(%q) = %q, want it to contain %q", tc.url, err, tc.want)
			}
		})
	}
}

func TestRelativeSQLitePath(t *testing.T) {
	t.Chdir(t.TempDir())
	r, err := registry.Open(context.Background(), "sqlite:registry.db", registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	want, _ := filepath.Abs("registry.db")
	if r.String() != "sqlite://"+want {
		t.Errorf("String() = %q, want sqlite://%s", r.String(), want)
	}
}

// TestSQLiteWAL: the file is in WAL mode, so readers outside the controller (reporting,
// backups) never block it and are never blocked by it.
func TestSQLiteWAL(t *testing.T) {
	path := filepath.Join(t.TempDir(), "registry.db")
	r, err := registry.Open(context.Background(), "sqlite://"+path, registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var mode string
	if err := db.QueryRow("PRAGMA journal_mode").Scan(&mode); err != nil {
		t.Fatal(err)
	}
	if mode != "wal" {
		t.Errorf("journal_mode = %q, want wal", mode)
	}
}

func TestNewerSchemaRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "registry.db")
	r, err := registry.Open(context.Background(), "sqlite://"+path, registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO schema_migrations (version, name, applied_at) VALUES (999, '0999_future.sql', '2030-01-01')`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	_, err = registry.Open(context.Background(), "sqlite://"+path, registry.Options{})
	if err == nil || !contains(err.Error(), "schema is at version 999, newer than this controller knows") {
		t.Errorf("Open over a newer schema: %v", err)
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// TestPostgresPassword: the password may come apart from the URL, and no error ever
// shows it.
func TestPostgresPassword(t *testing.T) {
	ctx := context.Background()
	server, _ := postgresRegistry(t)

	r, err := registry.Open(ctx, server.URL("registry", false), registry.Options{Password: func() (string, error) { return pgtest.Password, nil }})
	if err != nil {
		t.Fatalf("Open with the password from Options: %v", err)
	}
	if strings.Contains(r.String(), pgtest.Password) {
		t.Errorf("String() shows the password: %s", r)
	}
	r.Close()

	for name, url := range map[string]string{
		"wrong password in URL":  strings.Replace(server.URL("registry", true), pgtest.Password, "wrong-"+pgtest.Password, 1),
		"no such database":       server.URL("nope", true),
		"nothing listening":      strings.Replace(server.URL("registry", true), server.Addr(), "127.0.0.1:1", 1),
		"unparsable, with a pwd": "postgres://postgres:" + pgtest.Password + "@127.0.0.1:5432:99/x",
		"keyword/value string":   "host=127.0.0.1 port=" + server.Addr()[len("127.0.0.1:"):] + " user=postgres password=" + pgtest.Password + " dbname=registry",
		"keyword, quoted":        "user=postgres password='" + pgtest.Password + "' host=127.0.0.1",
	} {
		t.Run(name, func(t *testing.T) {
			r, err := registry.Open(ctx, url, registry.Options{})
			if err == nil {
				r.Close()
				t.Fatal("Open succeeded")
			}
			if strings.Contains(err.Error(), pgtest.Password) {
				t.Errorf("the error shows the password: %v", err)
			}
		})
	}
}

// postgresRegistry starts a PostgreSQL server with an empty database "registry" for
// one test, and returns it with an administrator's connection to that database.
func postgresRegistry(t *testing.T) (*pgtest.Server, *sql.DB) {
	t.Helper()
	server := pgtest.ForTest(t)
	if err := server.CreateDatabase(context.Background(), "registry"); err != nil {
		t.Fatal(err)
	}
	admin, err := sql.Open("pgx", server.URL("registry", true))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	return server, admin
}

// TestPostgresPasswordRotation: the password is read again for each new connection,
// so a Secret rotated under a running controller needs no restart.
func TestPostgresPasswordRotation(t *testing.T) {
	ctx := context.Background()
	server, admin := postgresRegistry(t)
	if _, err := admin.ExecContext(ctx, `CREATE ROLE rotated LOGIN PASSWORD 'first-password'; GRANT ALL ON SCHEMA public TO rotated`); err != nil {
		t.Fatal(err)
	}
	var current atomic.Value
	current.Store("first-password")
	url := strings.Replace(server.URL("registry", false), "postgres@", "rotated@", 1)
	r, err := registry.Open(ctx, url, registry.Options{
		Password:        func() (string, error) { return current.Load().(string), nil },
		ConnMaxLifetime: time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := admin.ExecContext(ctx, `ALTER ROLE rotated PASSWORD 'second-password'`); err != nil {
		t.Fatal(err)
	}
	current.Store("second-password")
	time.Sleep(10 * time.Millisecond) // past the connections' lifetime: the next write opens a new one
	if _, err := r.Upsert(ctx, student("u1", "ctl"), registry.Why{Cause: "test"}); err != nil {
		t.Errorf("write after the password was rotated: %v", err)
	}
}

// TestMigrationLockTimeout: a migration waiting behind another session's lock gives up
// after the lock timeout instead of waiting for ever (and holding up every statement
// queued behind its own request); Open fails and says why.
func TestMigrationLockTimeout(t *testing.T) {
	ctx := context.Background()
	server, holder := postgresRegistry(t)
	conn, err := holder.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// What a long-running migration of another replica, or a backup's lock, holds.
	if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock(1937011044)`); err != nil {
		t.Fatal(err)
	}
	openCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	began := time.Now()
	r, err := registry.Open(openCtx, server.URL("registry", true), registry.Options{MigrationLockTimeout: time.Second})
	if err == nil {
		r.Close()
		t.Fatal("Open succeeded while another session held the migration lock")
	}
	if took := time.Since(began); took > 10*time.Second || !strings.Contains(err.Error(), "lock timeout") {
		t.Errorf("Open gave up after %v with %v; want a lock timeout within seconds", took.Round(time.Millisecond), err)
	}
}
