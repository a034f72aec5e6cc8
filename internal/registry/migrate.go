package registry

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"
)

//go:embed migrations
var migrationFiles embed.FS

// migration is one embedded schema change, named NNNN_what.sql.
type migration struct {
	version int
	name    string
	sql     string
}

// limitLockWait bounds how long tx waits for any one lock, on PostgreSQL (SQLite's
// busy timeout does that there): past it the statement fails and the caller retries.
func limitLockWait(ctx context.Context, tx *sql.Tx, d *dialect, wait time.Duration) error {
	if d != postgres {
		return nil
	}
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", wait.Milliseconds())); err != nil {
		return fmt.Errorf("set lock_timeout: %w", err)
	}
	return nil
}

func loadMigrations(d *dialect) ([]migration, error) {
	entries, err := fs.ReadDir(migrationFiles, d.migrations)
	if err != nil {
		return nil, fmt.Errorf("read embedded migrations: %w", err)
	}
	var out []migration
	for _, e := range entries {
		prefix, _, ok := strings.Cut(e.Name(), "_")
		version, err := strconv.Atoi(prefix)
		if !ok || err != nil || !strings.HasSuffix(e.Name(), ".sql") {
			return nil, fmt.Errorf("embedded migration %q is not named NNNN_what.sql", e.Name())
		}
		body, err := fs.ReadFile(migrationFiles, path.Join(d.migrations, e.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, migration{version: version, name: e.Name(), sql: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	return out, nil
}

// migrate applies the embedded migrations that the database lacks, in one transaction
// under the database's write lock, so that it is safe when two controllers start at
// once and leaves the schema untouched when a migration fails.
//
// On PostgreSQL every lock it waits for is bounded by lockTimeout: a migration stuck
// behind a long transaction fails, and the caller retries, rather than holding up every
// statement queued behind its own lock request.
func migrate(ctx context.Context, db *sql.DB, d *dialect, now time.Time, lockTimeout time.Duration) error {
	migrations, err := loadMigrations(d)
	if err != nil {
		return err
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("begin migration: %w", err)
	}
	// A migration may change its connection's settings (SQLite's checks are off while
	// it copies rows written before them), so the connection is closed, not pooled.
	defer func() { _ = conn.Raw(func(any) error { return driver.ErrBadConn }) }()
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin migration: %w", err)
	}
	defer func() { _ = tx.Rollback() }()

	if err := limitLockWait(ctx, tx, d, lockTimeout); err != nil {
		return fmt.Errorf("migration: %w", err)
	}
	if d.lockMigrations != "" {
		if _, err := tx.ExecContext(ctx, d.lockMigrations); err != nil {
			return fmt.Errorf("lock for migration: %w", err)
		}
	}
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    INTEGER NOT NULL PRIMARY KEY,
		name       TEXT    NOT NULL,
		applied_at `+d.timestamp+` NOT NULL
	)`); err != nil {
		return fmt.Errorf("create schema_migrations: %w", err)
	}
	applied := map[int]bool{}
	rows, err := tx.QueryContext(ctx, `SELECT version FROM schema_migrations`)
	if err != nil {
		return fmt.Errorf("read schema_migrations: %w", err)
	}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return errors.Join(fmt.Errorf("read schema_migrations: %w", err), rows.Close())
		}
		applied[v] = true
	}
	if err := rows.Close(); err != nil {
		return fmt.Errorf("read schema_migrations: %w", err)
	}
	latest := 0
	for _, m := range migrations {
		latest = max(latest, m.version)
	}
	for v := range applied {
		if v > latest {
			return fmt.Errorf("the registry's schema is at version %d, newer than this controller knows (%d): run a newer controller: %w", v, latest, ErrSchemaNewer)
		}
	}
	for _, m := range migrations {
		if applied[m.version] {
			continue
		}
		if _, err := tx.ExecContext(ctx, m.sql); err != nil {
			return fmt.Errorf("apply migration %s: %w", m.name, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)`,
			m.version, m.name, now.UTC()); err != nil {
			return fmt.Errorf("record migration %s: %w", m.name, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit migration: %w", err)
	}
	return nil
}

// LatestSchema is the version of the newest migration this program carries: the schema
// it migrates a registry to.
func LatestSchema() int {
	migrations, err := loadMigrations(sqlite)
	if err != nil {
		panic(err) // embedded: a broken name fails every test
	}
	latest := 0
	for _, m := range migrations {
		latest = max(latest, m.version)
	}
	return latest
}

// schemaVersion is the registry's schema version; 0 when it has none.
func schemaVersion(ctx context.Context, db *sql.DB, d *dialect) (int, error) {
	var exists bool
	if err := db.QueryRowContext(ctx, d.tableExists, "schema_migrations").Scan(&exists); err != nil || !exists {
		return 0, err
	}
	var version sql.NullInt64
	if err := db.QueryRowContext(ctx, `SELECT MAX(version) FROM schema_migrations`).Scan(&version); err != nil {
		return 0, fmt.Errorf("read the schema's version: %w", err)
	}
	return int(version.Int64), nil
}

// checkSchema tells whether the schema is the one migrate brings the database to, for
// a registry opened read-only: ErrNoSchema when it has none, an error saying which
// versions when it is older or newer.
func checkSchema(ctx context.Context, db *sql.DB, d *dialect) error {
	migrations, err := loadMigrations(d)
	if err != nil {
		return err
	}
	latest := 0
	for _, m := range migrations {
		latest = max(latest, m.version)
	}
	var exists bool
	if err := db.QueryRowContext(ctx, d.tableExists, "schema_migrations").Scan(&exists); err != nil {
		return fmt.Errorf("read the schema's version: %w", err)
	}
	if !exists {
		return ErrNoSchema
	}
	var version sql.NullInt64
	if err := db.QueryRowContext(ctx, `SELECT MAX(version) FROM schema_migrations`).Scan(&version); err != nil {
		return fmt.Errorf("read the schema's version: %w", err)
	}
	switch v := int(version.Int64); {
	case !version.Valid:
		return ErrNoSchema
	case v > latest:
		return fmt.Errorf("the registry's schema is at version %d, newer than this controller knows (%d): run a newer controller: %w", v, latest, ErrSchemaNewer)
	case v < latest:
		return fmt.Errorf("the registry's schema is at version %d, older than this program's (%d), and is not migrated here: "+
			"a controller of this version migrates it when it starts to write: %w", v, latest, ErrSchemaOlder)
	}
	return nil
}
