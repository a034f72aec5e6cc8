package registry

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"
)

var (
	// ErrNotFound: the registry has no row for that UID.
	ErrNotFound = errors.New("no registry row")
	// ErrNotOwned: the row belongs to another owner, or was released; the registry
	// refuses to change or delete it on behalf of this owner.
	ErrNotOwned = errors.New("registry row not owned")
)

// Record is one row of the students table.
type Record struct {
	// UID is the Student object's metadata.uid; the primary key.
	UID string
	// Namespace and Name name the Student object.
	Namespace string
	Name      string
	// StudentName is the student's display name (spec.name).
	StudentName string
	// School is spec.school.
	School string
	// Owner is the controller instance that owns the row; empty once released.
	Owner string
	// Generation is the object's metadata.generation last written.
	Generation int64
	// CreatedAt and UpdatedAt are set by the registry on write.
	CreatedAt time.Time
	UpdatedAt time.Time
	// ReleasedAt is when the row was released; zero while it is owned.
	ReleasedAt time.Time
}

// Options tune a Registry. The zero value is ready to use.
type Options struct {
	// Now is the clock that stamps rows; time.Now when nil.
	Now func() time.Time
	// Password for PostgreSQL, in place of one in the URL: from a file or an
	// environment variable, so that it never shows in a command line.
	Password string
	// MaxOpenConns and MaxIdleConns size the connection pool; 0 takes the defaults
	// (10 and 5). ConnMaxLifetime recycles connections (default 30 minutes), so that
	// a fail-over or a load balancer's change is picked up.
	MaxOpenConns    int
	MaxIdleConns    int
	ConnMaxLifetime time.Duration
}

// Registry is the student registry over one database.
type Registry struct {
	db      *sql.DB
	dialect *dialect
	display string
	now     func() time.Time
	// The statements of every sync, prepared once: parsing them again on each call
	// took 8% of the controller's CPU time with SQLite.
	get, upsert, del, release *sql.Stmt
}

const columns = `uid, namespace, name, student_name, school, owner, generation, created_at, updated_at, released_at`

// Statements of the hot path. $n placeholders: PostgreSQL's, and SQLite takes them too.
const (
	getSQL    = `SELECT ` + columns + ` FROM students WHERE uid = $1`
	upsertSQL = `
		INSERT INTO students (uid, namespace, name, student_name, school, owner, generation, created_at, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
		ON CONFLICT (uid) DO UPDATE SET
			namespace = excluded.namespace,
			name = excluded.name,
			student_name = excluded.student_name,
			school = excluded.school,
			generation = excluded.generation,
			updated_at = excluded.updated_at
		WHERE students.owner = excluded.owner
		RETURNING created_at, updated_at`
	deleteSQL  = `DELETE FROM students WHERE uid = $1 AND owner = $2`
	releaseSQL = `UPDATE students SET owner = NULL, released_at = $1, updated_at = $2 WHERE uid = $3 AND owner = $4`
)

// Open connects to the registry at rawURL (see parseURL for the forms it takes) and
// brings its schema up to date. The database/sql driver for the URL's scheme must be
// registered by the program: modernc.org/sqlite for sqlite, github.com/jackc/pgx/v5/stdlib
// for postgres. No error it returns holds the password.
func Open(ctx context.Context, rawURL string, opts Options) (*Registry, error) {
	src, err := parseURL(rawURL, opts.Password)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(sql.Drivers(), src.dialect.driver) {
		return nil, fmt.Errorf("open registry %s: database/sql driver %q is not registered in this program", src.display, src.dialect.driver)
	}
	db, err := sql.Open(src.dialect.driver, src.dsn)
	if err != nil {
		return nil, fmt.Errorf("open registry %s: %w", src.display, err)
	}
	db.SetMaxOpenConns(cmp.Or(opts.MaxOpenConns, 10))
	db.SetMaxIdleConns(cmp.Or(opts.MaxIdleConns, 5))
	db.SetConnMaxLifetime(cmp.Or(opts.ConnMaxLifetime, 30*time.Minute))
	r := &Registry{db: db, dialect: src.dialect, display: src.display, now: opts.Now}
	if r.now == nil {
		r.now = time.Now
	}
	if err := ping(ctx, db, src.dialect); err != nil {
		db.Close()
		return nil, fmt.Errorf("open registry %s: %w", src.display, err)
	}
	if err := migrate(ctx, db, src.dialect, r.now()); err != nil {
		db.Close()
		return nil, fmt.Errorf("migrate registry %s: %w", src.display, err)
	}
	for _, p := range []struct {
		stmt  **sql.Stmt
		query string
	}{{&r.get, getSQL}, {&r.upsert, upsertSQL}, {&r.del, deleteSQL}, {&r.release, releaseSQL}} {
		if *p.stmt, err = db.PrepareContext(ctx, p.query); err != nil {
			r.Close()
			return nil, fmt.Errorf("open registry %s: prepare statements: %w", src.display, err)
		}
	}
	return r, nil
}

// ping checks that the database answers. A connection to a new SQLite file switches
// it to WAL, which needs the file to itself and fails at once with SQLITE_BUSY,
// without waiting out the busy timeout, when another process opens the file at the
// same moment: that is retried for as long as the busy timeout would have waited.
func ping(ctx context.Context, db *sql.DB, d *dialect) error {
	const sqliteBusy = 5
	deadline := time.Now().Add(sqliteBusyTimeout)
	for {
		err := db.PingContext(ctx)
		var coded interface{ Code() int }
		if err == nil || d != sqlite || !errors.As(err, &coded) || coded.Code()&0xff != sqliteBusy || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// String names the registry for logs; it never holds a password.
func (r *Registry) String() string { return r.display }

// Close closes the prepared statements and the database connections.
func (r *Registry) Close() error {
	for _, stmt := range []*sql.Stmt{r.get, r.upsert, r.del, r.release} {
		if stmt != nil {
			stmt.Close()
		}
	}
	return r.db.Close()
}

// Ping reports whether the database answers.
func (r *Registry) Ping(ctx context.Context) error { return r.db.PingContext(ctx) }

func scanRecord(row interface{ Scan(...any) error }) (Record, error) {
	var rec Record
	var owner sql.NullString
	var released sql.NullTime
	err := row.Scan(&rec.UID, &rec.Namespace, &rec.Name, &rec.StudentName, &rec.School,
		&owner, &rec.Generation, &rec.CreatedAt, &rec.UpdatedAt, &released)
	if err != nil {
		return Record{}, err
	}
	rec.Owner = owner.String
	rec.CreatedAt = rec.CreatedAt.UTC()
	rec.UpdatedAt = rec.UpdatedAt.UTC()
	if released.Valid {
		rec.ReleasedAt = released.Time.UTC()
	}
	return rec, nil
}

// Get returns the row for uid, or ErrNotFound.
func (r *Registry) Get(ctx context.Context, uid string) (Record, error) {
	rec, err := scanRecord(r.get.QueryRowContext(ctx, uid))
	if errors.Is(err, sql.ErrNoRows) {
		return Record{}, fmt.Errorf("uid %s: %w", uid, ErrNotFound)
	}
	if err != nil {
		return Record{}, fmt.Errorf("get row %s: %w", uid, err)
	}
	return rec, nil
}

// List returns the rows that owner owns, by namespace and name.
func (r *Registry) List(ctx context.Context, owner string) ([]Record, error) {
	rows, err := r.db.QueryContext(ctx, `SELECT `+columns+` FROM students WHERE owner = $1 ORDER BY namespace, name, uid`, owner)
	if err != nil {
		return nil, fmt.Errorf("list rows of %q: %w", owner, err)
	}
	defer rows.Close()
	var out []Record
	for rows.Next() {
		rec, err := scanRecord(rows)
		if err != nil {
			return nil, fmt.Errorf("list rows of %q: %w", owner, err)
		}
		out = append(out, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list rows of %q: %w", owner, err)
	}
	return out, nil
}

// Upsert writes rec as rec.Owner: it inserts the row, or updates it when rec.Owner
// owns it, and returns the row as stored. A row with another owner, or a released one,
// is left alone and ErrNotOwned returned.
func (r *Registry) Upsert(ctx context.Context, rec Record) (Record, error) {
	if rec.UID == "" || rec.Owner == "" {
		return Record{}, fmt.Errorf("upsert row: uid and owner are required (uid %q, owner %q)", rec.UID, rec.Owner)
	}
	now := r.now().UTC()
	stored := rec
	err := r.upsert.QueryRowContext(ctx,
		rec.UID, rec.Namespace, rec.Name, rec.StudentName, rec.School, rec.Owner, rec.Generation, now, now,
	).Scan(&stored.CreatedAt, &stored.UpdatedAt)
	if errors.Is(err, sql.ErrNoRows) {
		return Record{}, r.notOwned(ctx, rec.UID)
	}
	if err != nil {
		return Record{}, fmt.Errorf("upsert row %s: %w", rec.UID, err)
	}
	stored.CreatedAt = stored.CreatedAt.UTC()
	stored.UpdatedAt = stored.UpdatedAt.UTC()
	stored.ReleasedAt = time.Time{}
	return stored, nil
}

// Delete deletes the row for uid if owner owns it. It reports whether a row was
// deleted: a missing row is no error (the delete already happened); a row with another
// owner is ErrNotOwned.
func (r *Registry) Delete(ctx context.Context, uid, owner string) (bool, error) {
	res, err := r.del.ExecContext(ctx, uid, owner)
	if err != nil {
		return false, fmt.Errorf("delete row %s: %w", uid, err)
	}
	return r.changedOrAbsent(ctx, res, uid)
}

// Release gives up owner's claim on the row for uid: the row stays, with no owner, and
// no controller changes it again. It reports whether a row was released: a missing row
// is no error; a row with another owner, or already released, is ErrNotOwned.
func (r *Registry) Release(ctx context.Context, uid, owner string) (bool, error) {
	now := r.now().UTC()
	res, err := r.release.ExecContext(ctx, now, now, uid, owner)
	if err != nil {
		return false, fmt.Errorf("release row %s: %w", uid, err)
	}
	return r.changedOrAbsent(ctx, res, uid)
}

func (r *Registry) changedOrAbsent(ctx context.Context, res sql.Result, uid string) (bool, error) {
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("row %s: %w", uid, err)
	}
	if n > 0 {
		return true, nil
	}
	err = r.notOwned(ctx, uid)
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	return false, err
}

// notOwned explains why a write guarded by owner changed nothing.
func (r *Registry) notOwned(ctx context.Context, uid string) error {
	rec, err := r.Get(ctx, uid)
	if err != nil {
		return err
	}
	if rec.Owner == "" {
		return fmt.Errorf("row %s was released at %s: %w", uid, rec.ReleasedAt.Format(time.RFC3339), ErrNotOwned)
	}
	return fmt.Errorf("row %s is owned by %q: %w", uid, rec.Owner, ErrNotOwned)
}
