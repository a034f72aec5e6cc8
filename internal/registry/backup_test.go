package registry_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/student-controller/student-controller/internal/registry"
	"github.com/student-controller/student-controller/internal/testenv/registrytest"
)

// TestBackup: a backup taken while writers go on is one moment of the registry: every
// row in it has the history row written with it, and nothing else.
func TestBackup(t *testing.T) {
	ctx := context.Background()
	url, _ := registrytest.SQLiteBackend().New(t)
	r := open(t, url, newFakeClock())
	if _, err := r.Upsert(ctx, student("first", "ctl"), registry.Why{Cause: registry.CauseNewStudent}); err != nil {
		t.Fatal(err)
	}

	// Four writers each insert rows until the backup is done; it starts once they
	// have written some.
	done := make(chan struct{})
	var written atomic.Int64
	started := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				if _, err := r.Insert(ctx, student(fmt.Sprintf("w%d-%d", w, i), "ctl"), registry.CauseNewStudent); err != nil {
					t.Error(err)
					return
				}
				if written.Add(1) == 20 {
					close(started)
				}
			}
		})
	}
	<-started
	to := filepath.Join(t.TempDir(), "backup.db")
	var synced []string
	defer registry.SetSyncPath(func(path string) error {
		synced = append(synced, path)
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		return errors.Join(f.Sync(), f.Close())
	})()
	c, err := registry.Backup(ctx, parse(t, url), to)
	close(done)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	// It says done once the copy and its name are on disk.
	if want := []string{to, filepath.Dir(to)}; !slices.Equal(synced, want) {
		t.Errorf("the backup synced %q; want the copy and its folder, %q", synced, want)
	}
	t.Logf("the backup holds %d rows; %d were written in all", c.Rows, written.Load()+1)
	if c.Rows < 21 || c.Rows != c.History {
		t.Errorf("backup holds %d rows and %d history rows: want the same number, each row with its own", c.Rows, c.History)
	}
	if info, err := os.Stat(c.Path); err != nil {
		t.Error(err)
	} else if info.Mode().Perm() != 0o600 {
		t.Errorf("the backup's mode: %v; want 0600, its owner's alone", info.Mode())
	}

	// The copy is a registry of its own, at the same schema.
	copied, err := registry.Open(ctx, "sqlite://"+c.Path, registry.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer copied.Close()
	if _, err := copied.Get(ctx, "first"); err != nil {
		t.Errorf("the row written before the backup, in the copy: %v", err)
	}

	t.Run("refused", func(t *testing.T) {
		before, err := os.ReadFile(c.Path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := registry.Backup(ctx, parse(t, url), c.Path); err == nil || !strings.Contains(err.Error(), "exists already") {
			t.Errorf("a backup over an existing file: %v, want it refused", err)
		}
		if after, _ := os.ReadFile(c.Path); string(after) != string(before) {
			t.Error("the refused backup changed the existing file")
		}
		if _, err := registry.Backup(ctx, parse(t, "postgres://u@db/students"), filepath.Join(t.TempDir(), "x")); err == nil || !strings.Contains(err.Error(), "pg_dump") {
			t.Errorf("a backup of PostgreSQL: %v, want it to name pg_dump", err)
		}
		if _, err := registry.Backup(ctx, parse(t, "sqlite://"+filepath.Join(t.TempDir(), "none.db")), filepath.Join(t.TempDir(), "x")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a backup of a missing file: %v, want ErrNotExist", err)
		}
	})
}

// TestSchemaLeftAlone: a registry opened with KeepSchema is not migrated, and says
// so; CheckSchema tells a controller that a newer program has migrated its registry.
func TestSchemaLeftAlone(t *testing.T) {
	ctx := context.Background()
	url, db := registrytest.SQLiteBackend().New(t)
	open(t, url, newFakeClock()).Close()
	// The schema of the version before the history (migration 4).
	if _, err := db.Exec(`DROP TABLE student_history; ALTER TABLE fences DROP COLUMN holder; ALTER TABLE fences DROP COLUMN expires_at; ALTER TABLE fences DROP COLUMN mark; ALTER TABLE students DROP COLUMN student_uid; DELETE FROM schema_migrations WHERE version >= 4`); err != nil {
		t.Fatal(err)
	}
	if _, err := registry.Open(ctx, url, registry.Options{KeepSchema: true}); !errors.Is(err, registry.ErrSchemaOlder) {
		t.Fatalf("KeepSchema Open of an older schema: %v, want ErrSchemaOlder", err)
	}
	var version int
	if err := db.QueryRow(`SELECT MAX(version) FROM schema_migrations`).Scan(&version); err != nil || version != 3 {
		t.Fatalf("schema version after a KeepSchema Open: %d, %v; want 3, unchanged", version, err)
	}
	if _, err := registry.Open(ctx, "sqlite://"+filepath.Join(t.TempDir(), "none.db"), registry.Options{KeepSchema: true}); !errors.Is(err, registry.ErrNoSchema) {
		t.Errorf("KeepSchema Open of a missing file: %v, want ErrNoSchema", err)
	}

	r := open(t, url, newFakeClock()) // migrates
	if err := r.CheckSchema(ctx); err != nil {
		t.Errorf("CheckSchema of the schema just migrated: %v", err)
	}
	if _, err := db.Exec(`INSERT INTO schema_migrations (version, name, applied_at) VALUES (999, '0999_future.sql', '2026-12-03 00:00:00')`); err != nil {
		t.Fatal(err)
	}
	if err := r.CheckSchema(ctx); !errors.Is(err, registry.ErrSchemaNewer) {
		t.Errorf("CheckSchema after a newer program migrated: %v, want ErrSchemaNewer", err)
	}
}

// parse parses a registry URL the test knows to be good.
func parse(t *testing.T, raw string) registry.URL {
	t.Helper()
	u, err := registry.ParseURL(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// TestBackupSyncFails: a copy that cannot be synced is no backup: Backup fails and
// leaves no file, so that a retry to the same path works.
func TestBackupSyncFails(t *testing.T) {
	ctx := context.Background()
	url, _ := registrytest.SQLiteBackend().New(t)
	r := open(t, url, newFakeClock())
	if _, err := r.Upsert(ctx, student("first", "ctl"), registry.Why{Cause: registry.CauseNewStudent}); err != nil {
		t.Fatal(err)
	}
	to := filepath.Join(t.TempDir(), "backup.db")
	undo := registry.SetSyncPath(func(string) error { return errors.New("disk gone") })
	_, err := registry.Backup(ctx, parse(t, url), to)
	undo()
	if err == nil || !strings.Contains(err.Error(), "disk gone") {
		t.Fatalf("a backup whose sync fails: %v, want the error", err)
	}
	if _, err := os.Stat(to); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the copy after a failed sync: %v, want it removed", err)
	}
	if _, err := registry.Backup(ctx, parse(t, url), to); err != nil {
		t.Errorf("the retry: %v", err)
	}
}
