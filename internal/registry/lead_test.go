package registry_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/student-controller/student-controller/internal/registry"
	"github.com/student-controller/student-controller/internal/testenv/pgtest"
	"github.com/student-controller/student-controller/internal/testenv/registrytest"
)

// TestMigrateAgainAfterAFailedPrepare: a registry opened with MigrateLater whose first
// Migrate failed while preparing its statements (here the history table is away for a
// moment) is whole after the next Migrate: no write meets a statement left unprepared.
func TestMigrateAgainAfterAFailedPrepare(t *testing.T) {
	ctx := context.Background()
	url, db := registrytest.SQLiteBackend().New(t)
	open(t, url, newFakeClock()).Close()
	r, err := registry.Open(ctx, url, registry.Options{MigrateLater: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	if _, err := db.Exec(`ALTER TABLE student_history RENAME TO student_history_away`); err != nil {
		t.Fatal(err)
	}
	if err := r.Migrate(ctx); err == nil {
		t.Fatal("Migrate without the history table succeeded, want a failure to prepare")
	}
	if _, err := db.Exec(`ALTER TABLE student_history_away RENAME TO student_history`); err != nil {
		t.Fatal(err)
	}
	if err := r.Migrate(ctx); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	if _, err := r.Upsert(ctx, student("u1", "ctl"), registry.Why{Cause: "test"}); err != nil {
		t.Errorf("Upsert after Migrate succeeded again: %v", err)
	}
}

// TestLead: a controller that leads while another holds the owner's fence waits, says
// who holds it, and changes nothing meanwhile (no binding); once the fence is given
// back it takes it, binds the owner and may write; Hold gives it back when it ends.
func TestLead(t *testing.T) {
	ctx := context.Background()
	url, _ := registrytest.SQLiteBackend().New(t)
	other := openWith(t, url, registry.Options{Actor: "other", LeaseDuration: time.Minute})
	if _, err := other.TakeFence(ctx, "ctl"); err != nil {
		t.Fatal(err)
	}
	r, cluster, err := registry.Connect(ctx, parse(t, url), "ctl", func(context.Context) (string, error) { return "cluster-a", nil },
		registry.Options{Actor: "me", LeaseDuration: time.Second})
	if err != nil || cluster != "cluster-a" {
		t.Fatalf("Connect: %v, cluster %q", err, cluster)
	}
	t.Cleanup(func() { r.Close() })
	heldBy := make(chan string, 100)
	led := make(chan error, 1)
	go func() {
		ok, err := r.Lead(ctx, "ctl", cluster, func(h *registry.HeldError) { heldBy <- h.Holder })
		if !ok && err == nil {
			err = errors.New("Lead ended without leading")
		}
		led <- err
	}()
	if h := <-heldBy; h != other.Holder() {
		t.Errorf("Lead waits for %q, want %q", h, other.Holder())
	}
	if _, err := other.BindingOf(ctx, "ctl"); !errors.Is(err, registry.ErrNotFound) {
		t.Errorf("the owner's binding while Lead waits: %v, want none", err)
	}
	if err := other.ReleaseFence(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-led:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Lead did not take the fence given back within 5 s")
	}
	if b, err := other.BindingOf(ctx, "ctl"); err != nil || b.Cluster != "cluster-a" {
		t.Errorf("the owner's binding once Lead returned: %+v, %v", b, err)
	}
	if _, err := r.Upsert(ctx, student("u1", "ctl"), registry.Why{Cause: "test"}); err != nil {
		t.Errorf("a write once leading: %v", err)
	}
	// Hold renews past the lease, then gives the fence back when its context ends.
	holdCtx, stop := context.WithCancel(ctx)
	held := make(chan error, 1)
	go func() { held <- r.Hold(holdCtx) }()
	time.Sleep(1500 * time.Millisecond)
	if _, err := other.TakeFence(ctx, "ctl"); !errors.Is(err, registry.ErrHeld) {
		t.Errorf("TakeFence while Hold renews: %v, want ErrHeld", err)
	}
	stop()
	if err := <-held; err != nil {
		t.Errorf("Hold: %v", err)
	}
	if _, err := other.TakeFence(ctx, "ctl"); err != nil {
		t.Errorf("TakeFence once Hold gave it back: %v", err)
	}
}

// TestHoldChecksWhatLeadFound: with each renewal of the fence, Hold checks the owner's
// binding and the schema again, so a controller stops once its owner was moved to
// another cluster or a newer program migrated the schema, even with the sweep off;
// it gives the fence back, and the next controller takes it at once.
func TestHoldChecksWhatLeadFound(t *testing.T) {
	for name, change := range map[string]struct {
		sql  string
		want error
	}{
		"owner moved":  {`UPDATE owner_clusters SET cluster = 'cluster-b' WHERE owner = 'ctl'`, registry.ErrOtherCluster},
		"schema newer": {`INSERT INTO schema_migrations (version, name, applied_at) VALUES (999, '0999_future.sql', '2026-12-06 00:00:00')`, registry.ErrSchemaNewer},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			url, db := registrytest.SQLiteBackend().New(t)
			r := openWith(t, url, registry.Options{Actor: "me", LeaseDuration: 300 * time.Millisecond})
			if ok, err := r.Lead(ctx, "ctl", "cluster-a", nil); !ok || err != nil {
				t.Fatalf("Lead: %v, %v", ok, err)
			}
			held := make(chan error, 1)
			go func() { held <- r.Hold(ctx) }()
			if _, err := db.Exec(change.sql); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-held:
				if !errors.Is(err, change.want) {
					t.Fatalf("Hold: %v, want %v", err, change.want)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Hold goes on after the change")
			}
			var holder sql.NullString
			if err := db.QueryRow(`SELECT holder FROM fences WHERE owner = 'ctl'`).Scan(&holder); err != nil || holder.Valid {
				t.Errorf("the fence's holder after Hold ended: %v, %v; want none: given back", holder, err)
			}
		})
	}
}

// TestWaiterLocksNothing: on PostgreSQL a controller that waits for another's fence
// takes no lock the holder needs while the lease is live. It asks with a read first,
// and writes only once the lease has lapsed: a waiter paused inside TakeFence's
// transaction, after its write, would otherwise hold the fence's row locked (an
// insert ON CONFLICT locks the row even when its WHERE is false), and every fenced
// write of the holder would wait for it.
func TestWaiterLocksNothing(t *testing.T) {
	ctx := context.Background()
	url, _ := registrytest.NewDatabase(t, pgtest.ForTest(t))
	holder := openWith(t, url, registry.Options{Actor: "holder", LeaseDuration: 15 * time.Second, LockWait: 2 * time.Second})
	if _, err := holder.TakeFence(ctx, "ctl"); err != nil {
		t.Fatal(err)
	}
	waiter := openWith(t, url, registry.Options{Actor: "waiter", LeaseDuration: 15 * time.Second})
	stalled, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	registry.SetFenceStall(waiter, func() {
		once.Do(func() { close(stalled) })
		<-release
	})
	took := make(chan error, 1)
	go func() {
		_, err := waiter.TakeFence(ctx, "ctl")
		took <- err
	}()
	var waited error
	select {
	case <-stalled: // paused inside its transaction
	case waited = <-took: // refused without writing
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter's TakeFence neither stalled nor returned")
	}
	writeCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err := holder.Upsert(writeCtx, student("u1", "ctl"), registry.Why{Cause: "test"})
	cancel()
	close(release)
	if err != nil {
		t.Errorf("the holder's write while a controller waits for its fence: %v", err)
	}
	if waited == nil {
		waited = <-took
	}
	var held *registry.HeldError
	if !errors.As(waited, &held) || held.Holder != holder.Holder() {
		t.Errorf("the waiter's TakeFence: %v, want the fence held by %s", waited, holder.Holder())
	}
}

// TestLeadNeverTakesAFailedReadForAnOlderSchema: a controller that cannot read the
// schema's version (a database blip) retries the read, and never migrates for it.
// Here the registry is of the schema before this program's and another controller
// holds the fence: after the blip, Lead waits for the holder, and the schema stays
// as it is.
func TestLeadNeverTakesAFailedReadForAnOlderSchema(t *testing.T) {
	ctx := context.Background()
	url, db := registrytest.SQLiteBackend().New(t)
	open(t, url, newFakeClock()).Close()
	// Back to the schema before 0008.
	if _, err := db.Exec(`DROP INDEX students_released_by; ALTER TABLE students DROP COLUMN released_by;
		ALTER TABLE students DROP COLUMN release_cause; ALTER TABLE fences DROP COLUMN mark;
		ALTER TABLE students DROP COLUMN student_uid; DELETE FROM schema_migrations WHERE version >= 8`); err != nil {
		t.Fatal(err)
	}
	holder, err := registry.Open(ctx, url, registry.Options{Actor: "holder", LeaseDuration: time.Minute, MigrateLater: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Close() })
	if _, err := holder.TakeFence(ctx, "ctl"); err != nil {
		t.Fatal(err)
	}
	r, err := registry.Open(ctx, url, registry.Options{Actor: "me", MigrateLater: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	failed := 0
	registry.SetSchemaReadFault(r, func() error {
		if failed == 0 {
			failed++
			return errors.New("the database blinked")
		}
		return nil
	})
	leadCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
	ok, err := r.Lead(leadCtx, "ctl", "cluster-a", nil)
	cancel()
	if ok || err != nil || failed != 1 {
		t.Errorf("Lead: %v, %v after %d failed reads; want it still waiting for the holder when its context ended", ok, err, failed)
	}
	var version int
	if err := db.QueryRow(`SELECT MAX(version) FROM schema_migrations`).Scan(&version); err != nil || version != 7 {
		t.Errorf("the schema after Lead: %d, %v; want 7, not migrated under the holder", version, err)
	}
}
