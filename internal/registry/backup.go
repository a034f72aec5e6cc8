package registry

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// Copy is what a backup holds.
type Copy struct {
	// Path is the backup's file, absolute.
	Path string
	// Rows and History count its students and student_history rows.
	Rows, History int64
}

// Backup copies the SQLite registry at u to the new file path: its rows,
// history, bindings and fences as of one moment, whatever its schema's version, taken
// while controllers go on writing (VACUUM INTO reads one snapshot and blocks no
// writer). It only reads the registry. The copy is a registry file like any other: a
// restore puts it in place of the registry's file while no controller runs. A
// PostgreSQL registry is backed up with pg_dump.
func Backup(ctx context.Context, u URL, path string) (Copy, error) {
	src := u.src
	if src.dialect != sqlite {
		return Copy{}, fmt.Errorf("back up registry %s: a PostgreSQL registry is backed up with pg_dump (docs/backup-and-restore.md)", src.display)
	}
	if _, err := os.Stat(src.path); err != nil {
		return Copy{}, fmt.Errorf("back up registry %s: %w", src.display, err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return Copy{}, fmt.Errorf("back up registry %s: %w", src.display, err)
	}
	// Made here, empty, which VACUUM INTO takes: never a file someone else made, and
	// readable by its owner alone, since it holds the registry's personal data.
	f, err := os.OpenFile(abs, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600) // #nosec G304 -- the file the operator names
	if errors.Is(err, os.ErrExist) {
		return Copy{}, fmt.Errorf("back up registry %s: %s exists already; give a new file", src.display, abs)
	}
	if err != nil {
		return Copy{}, fmt.Errorf("back up registry %s: %w", src.display, err)
	}
	if err := f.Close(); err != nil {
		return Copy{}, errors.Join(fmt.Errorf("back up registry %s: %w", src.display, err), os.Remove(abs))
	}
	src.dsn = sqliteReadOnlyDSN(src.path, false)
	db, err := openDB(src, nil)
	if err != nil {
		return Copy{}, errors.Join(fmt.Errorf("back up registry %s: %w", src.display, err), os.Remove(abs))
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `VACUUM INTO $1`, abs); err != nil {
		return Copy{}, errors.Join(fmt.Errorf("back up registry %s to %s: %w", src.display, abs, err), os.Remove(abs))
	}
	// VACUUM INTO leaves the copy to the page cache: on disk, and its name in its
	// folder, before the backup says it is done.
	if err := syncPath(abs); err != nil {
		return Copy{}, errors.Join(fmt.Errorf("back up registry %s to %s: sync it: %w", src.display, abs, err), os.Remove(abs))
	}
	// Some file systems cannot sync a folder (EINVAL): the copy is on disk then, as
	// far as they can say.
	if err := syncPath(filepath.Dir(abs)); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOTSUP) {
		return Copy{}, errors.Join(fmt.Errorf("back up registry %s to %s: sync its folder: %w", src.display, abs, err), os.Remove(abs))
	}
	return countCopy(ctx, abs)
}

// syncPath flushes the file or folder at path to disk.
var syncPath = func(path string) error {
	f, err := os.Open(path) // #nosec G304 -- the backup and its folder
	if err != nil {
		return err
	}
	return errors.Join(f.Sync(), f.Close())
}

// countCopy reads back the backup at path: how many rows and history rows it holds.
func countCopy(ctx context.Context, path string) (Copy, error) {
	c := Copy{Path: path}
	db, err := openDB(source{dialect: sqlite, path: path, dsn: sqliteReadOnlyDSN(path, true)}, nil)
	if err != nil {
		return c, fmt.Errorf("read the backup %s back: %w", path, err)
	}
	defer db.Close()
	for table, n := range map[string]*int64{"students": &c.Rows, "student_history": &c.History} {
		var exists bool
		if err := db.QueryRowContext(ctx, sqlite.tableExists, table).Scan(&exists); err != nil {
			return c, fmt.Errorf("read the backup %s back: %w", path, err)
		}
		if !exists {
			continue // a registry from before the history
		}
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM `+table).Scan(n); err != nil { // #nosec G202 -- one of two table names above
			return c, fmt.Errorf("read the backup %s back: %w", path, err)
		}
	}
	return c, nil
}
