package registry

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

var (
	// ErrNotFound: the registry has no row for that UID.
	ErrNotFound = errors.New("no registry row")
	// ErrNotOwned: the row belongs to another owner, or was released; the registry
	// refuses to change or delete it on behalf of this owner.
	ErrNotOwned = errors.New("registry row not owned")
	// ErrMalformed: the row holds values the registry cannot read, written past the
	// schema's checks or before them. Upsert rewrites such a row when it is the owner's.
	ErrMalformed = errors.New("malformed registry row")
	// ErrStale: the write carries an older generation of the Student than the row
	// holds, from a writer whose cache is behind (a former leader that woke up late);
	// the registry refuses it, so a row never goes back in generation.
	ErrStale = errors.New("registry row holds a newer generation")
	// ErrOtherCluster: the owner is bound to another cluster than the caller's;
	// a controller watching the wrong cluster would otherwise take every row for an
	// orphan.
	ErrOtherCluster = errors.New("the registry owner belongs to another cluster")
	// ErrSchemaNewer: the registry's schema is newer than this program knows.
	ErrSchemaNewer = errors.New("registry schema newer than this controller")
	// ErrSchemaOlder: a registry opened read-only or with KeepSchema has a schema
	// older than this program's, which it does not migrate.
	ErrSchemaOlder = errors.New("registry schema older than this controller")
	// ErrNoSchema: a registry opened read-only has no schema yet (a new database, or
	// a SQLite file not yet made): it holds no rows, and the controller makes the
	// schema when it first starts.
	ErrNoSchema = errors.New("the registry has no schema yet")
	// ErrFenced: another controller of the same owner took the owner's write fence
	// after this one (a new leader); the write was rolled back.
	ErrFenced = errors.New("another controller took over this owner's writes")
	// ErrExists: Insert found a row for the UID already, of whatever owner or state,
	// and left it as it is.
	ErrExists = errors.New("registry row exists")
	// ErrObserved: the row is observed, not managed (its Student's spec.management is
	// Observe); Relinquish leaves it as it is.
	ErrObserved = errors.New("registry row observed, not managed")
	// ErrHeld: another live controller of the owner holds the owner's write fence
	// (its lease has not run out); TakeFence returns a *HeldError that names it.
	ErrHeld = errors.New("another controller holds this owner's write fence")
)

// Deletion policies a row records, as its Student's spec.deletionPolicy says.
const (
	PolicyDelete = "Delete"
	PolicyOrphan = "Orphan"
)

// ManagementObserve is what a row records while its Student only observes it
// (spec.management: Observe); a managed row records nothing ("").
const ManagementObserve = "Observe"

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
	// DeletionPolicy is PolicyDelete or PolicyOrphan: what happens to the row when it
	// is found without its Student. Empty for a row written before the registry
	// recorded it; such a row is released, never deleted.
	DeletionPolicy string
	// Management is ManagementObserve while the row's Student only observes it, and
	// "" while the controller manages it. An observed row is never let go by a path
	// that finds it without its Student (Relinquish).
	Management string
	// ReleasedBy and ReleaseCause say which owner released the row, and why (the
	// cause of its history row); empty while it is owned, and on rows released before
	// the registry recorded them.
	ReleasedBy   string
	ReleaseCause string
	// StudentUID is the uid of the Student bound to the row when the row's key is not
	// its Student's (a row adopt bound, which keeps the key another system wrote it
	// by); empty otherwise. Insert and Upsert write it on a new row; a write to a row
	// there keeps the binding it has.
	StudentUID string
}

// Options tune a Registry. The zero value is ready to use.
type Options struct {
	// Now is the clock that stamps rows; time.Now when nil.
	Now func() time.Time
	// Password for PostgreSQL, in place of one in the URL: from a file or an
	// environment variable, so that it never shows in a command line. It is called
	// for every new connection, so a rotated password is picked up without a restart.
	Password func() (string, error)
	// MaxOpenConns and MaxIdleConns size the connection pool; 0 takes the database's
	// defaults: 4 and 4 on SQLite, 10 and 5 on PostgreSQL. ConnMaxLifetime recycles connections (default 30 minutes), so that
	// a fail-over or a load balancer's change is picked up.
	MaxOpenConns    int
	MaxIdleConns    int
	ConnMaxLifetime time.Duration
	// MigrationLockTimeout bounds each lock a migration waits for on PostgreSQL
	// (default 10 seconds); Open then fails, and its caller retries.
	MigrationLockTimeout time.Duration
	// LockWait bounds how long a write waits for a row lock another session holds, on
	// PostgreSQL (DefaultLockWait when zero): past it the write fails alone and its
	// caller retries, rather than hold up the writes that share its transaction.
	LockWait time.Duration
	// Actor names the writer in the history rows it writes (the controller's Pod, or
	// its host); the host name when empty.
	Actor string
	// ReadOnly opens connections that cannot write (a SQLite file opened read-only, a
	// PostgreSQL session whose transactions are READ ONLY), does not migrate, and
	// requires the schema this program migrates to: ErrNoSchema when there is none yet
	// (a missing SQLite file is not made). For what only reads: plan, --dry-run.
	ReadOnly bool
	// LeaseDuration is how long the write fence stays this registry's without a
	// renewal (RenewFence), in the registry's clock: a crashed holder's fence is free
	// after it. 15 seconds when zero.
	LeaseDuration time.Duration
	// MigrateLater opens a registry to write without migrating its schema yet: it is
	// ready to write once Migrate has run. A standby replica opens it so, and migrates
	// only when it leads, never under the leader's feet. A schema newer than this
	// program's is refused at once (ErrSchemaNewer).
	MigrateLater bool
	// KeepSchema opens a registry that may write without changing its schema: one
	// older than this program's is refused with ErrSchemaOlder, none with ErrNoSchema
	// (a missing SQLite file is not made). The registry subcommands change the schema
	// only when asked (--migrate).
	KeepSchema bool
}

// MalformedRow is an owned row that List could not read and left out.
type MalformedRow struct {
	// UID is the row's uid as stored, empty when that is unreadable too.
	UID string
	// Problem says which columns hold what.
	Problem string
}

// Registry is the student registry over one database.
type Registry struct {
	db      *sql.DB
	dialect *dialect
	display string
	now     func() time.Time
	// The statements of every sync, prepared once: parsing them again on each call
	// was a visible share of the controller's CPU (bench/results/history.md).
	get, insert, upsert, rewind, release, delPolicy, releaseAsIs, recordPolicy, observe, adopt, takeBack, prune, keepAsItStands, fenceCheck, history *sql.Stmt
	// actor is Options.Actor, for the history.
	actor string
	// migrationLockTimeout is Options.MigrationLockTimeout; prepareMu guards Migrate.
	migrationLockTimeout time.Duration
	prepareMu            sync.Mutex
	// fence is the write token this registry holds (TakeFence), for fenceOwner; 0
	// while it holds none and writes unfenced.
	fence      atomic.Int64
	fenceOwner atomic.Pointer[string]
	// led is what Lead made this registry's, for Hold's checks; nil before.
	led atomic.Pointer[lead]
	// fenceStall, set by tests alone, runs inside TakeFence's transaction after its
	// write: a controller paused there. schemaReadFault, also, fails FenceIsLease's
	// read of the schema's version when it returns an error: a database blip.
	fenceStall      func()
	schemaReadFault func() error
	// holder names this registry in the fences it holds: the actor and a random
	// suffix, new in each process. lease is Options.LeaseDuration.
	holder string
	lease  time.Duration
	// lockWait is Options.LockWait.
	lockWait time.Duration
	// writer is this process's one turn to write, taken before a group's transaction
	// begins (nil when read-only; turn says who else takes it). With it, the writes
	// waiting for the turn go in one transaction (group.go). SQLite has one writer at a
	// time whatever this does; without it the controller's workers wait for one
	// another inside SQLite's busy handler, which polls with growing sleeps (1 ms up to
	// 100 ms) and leaves the lock idle between a commit and the next waiter's wake-up.
	// On PostgreSQL every fenced write ends by locking the fence's row until it
	// commits, so the writes of one owner commit one at a time there too: in a group,
	// one lock and one commit serve them all.
	writer chan struct{}
	// pending are the writes waiting for the turn.
	pendingMu sync.Mutex
	pending   []*pendingWrite
	// transactions counts the write transactions begun, for the tests of group commit.
	transactions atomic.Int64
}

const columns = `uid, namespace, name, student_name, school, owner, generation, created_at, updated_at, released_at, deletion_policy, management, released_by, release_cause, student_uid`

// Statements of the hot path. $n placeholders: PostgreSQL's, and SQLite takes them too.
// Writes set every column the schema checks, so that they also repair a row written
// past the checks: created_at is kept only when it can be read (%[1]s is the dialect's
// test of that), and an owned row is never a released one. Writes are monotonic in
// generation (%[2]s is the dialect's test): one that carries an older generation than
// the row holds changes nothing.
const (
	getSQL = `SELECT ` + columns + ` FROM students WHERE uid = $1`
	// The row that Insert and Upsert write, with rowValues' values and the Student's
	// uid where it is not the row's ($10). A write to a row there keeps its binding.
	newRowSQL = `
		INSERT INTO students (uid, namespace, name, student_name, school, owner, generation, created_at, updated_at, deletion_policy, student_uid)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8, $9, $10)`
	// Insert's: a row already there, of whatever owner or state, is left alone.
	insertSQL = newRowSQL + `
		ON CONFLICT (uid) DO NOTHING
		RETURNING created_at, updated_at`
	upsertSQL = newRowSQL + `
		ON CONFLICT (uid) DO UPDATE SET
			namespace = excluded.namespace,
			name = excluded.name,
			student_name = excluded.student_name,
			school = excluded.school,
			generation = excluded.generation,
			deletion_policy = excluded.deletion_policy,
			management = NULL,
			created_at = CASE WHEN %[1]s THEN students.created_at ELSE excluded.created_at END,
			updated_at = excluded.updated_at,
			released_at = NULL, released_by = NULL, release_cause = NULL
		WHERE students.owner = excluded.owner AND %[2]s
		RETURNING created_at, updated_at`
	// Rewind's, with rowValues' values: the owner's row, while it still holds the
	// generation it was found ahead at ($10), takes the Student's values and generation.
	rewindSQL = `
		UPDATE students SET namespace = $2, name = $3, student_name = $4, school = $5, generation = $7,
			created_at = CASE WHEN %[1]s THEN created_at ELSE $8 END, updated_at = $8,
			deletion_policy = $9, released_at = NULL, released_by = NULL, release_cause = NULL, management = NULL
		WHERE uid = $1 AND owner = $6 AND generation = $10
		RETURNING created_at, updated_at`
	// A released row keeps the Student's last spec.
	releaseSQL = `
		UPDATE students SET namespace = $3, name = $4, student_name = $5, school = $6, generation = $7,
			created_at = CASE WHEN %[1]s THEN created_at ELSE $8 END,
			owner = NULL, released_at = $8, updated_at = $8, deletion_policy = 'Orphan', management = NULL,
			released_by = $2, release_cause = $9
		WHERE uid = $1 AND owner = $2 AND %[2]s` + returned
	// What Delete runs: only a row that records the Delete policy goes; any other
	// (Orphan, or a policy not yet recorded) is released as it stands, which is also
	// what Relinquish runs. An observed row stays.
	deletePolicySQL = `DELETE FROM students WHERE uid = $1 AND owner = $2 AND deletion_policy = 'Delete' AND management IS NULL` + returned
	releaseAsIsSQL  = `
		UPDATE students SET created_at = CASE WHEN %[1]s THEN created_at ELSE $3 END,
			owner = NULL, released_at = $3, updated_at = $3, released_by = $2, release_cause = $4
		WHERE uid = $1 AND owner = $2 AND management IS NULL` + returned
	// TakeBack's, with rowValues' values: a row that owner $6 released, while it is
	// still released, is owned and written again.
	takeBackSQL = `
		UPDATE students SET namespace = $2, name = $3, student_name = $4, school = $5, owner = $6, generation = $7,
			created_at = CASE WHEN %[1]s THEN created_at ELSE $8 END, updated_at = $8,
			deletion_policy = $9, released_at = NULL, released_by = NULL, release_cause = NULL, management = NULL
		WHERE uid = $1 AND owner IS NULL AND released_by = $6 AND management IS NULL
		RETURNING created_at, updated_at`
	// The last statement of a fenced write: it locks the owner's fence row (on
	// PostgreSQL; SQLite's write lock covers the whole transaction) and finds it only
	// while it still holds this controller's token.
	fenceCheckSQL   = `UPDATE fences SET token = token WHERE owner = $1 AND token = $2`
	recordPolicySQL = `UPDATE students SET deletion_policy = $3 WHERE uid = $1 AND owner = $2 AND deletion_policy IS NULL` + returned
	// The owner's managed row becomes observed: nothing else of it changes.
	observeSQL = `UPDATE students SET management = 'Observe' WHERE uid = $1 AND owner = $2 AND management IS NULL` + returned
)

// Open connects to the registry at rawURL (see parseURL for the forms it takes) and
// brings its schema up to date. The database/sql driver for the URL's scheme must be
// registered by the program: modernc.org/sqlite for sqlite, github.com/jackc/pgx/v5/stdlib
// for postgres. No error it returns holds the password.
func Open(ctx context.Context, rawURL string, opts Options) (*Registry, error) {
	u, err := ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	return OpenURL(ctx, u, opts)
}

// OpenURL is Open of a URL parsed already.
func OpenURL(ctx context.Context, u URL, opts Options) (*Registry, error) {
	src := u.src
	if !slices.Contains(sql.Drivers(), src.dialect.driver) {
		return nil, fmt.Errorf("open registry %s: database/sql driver %q is not registered in this program", src.display, src.dialect.driver)
	}
	if (opts.ReadOnly || opts.KeepSchema) && src.dialect == sqlite {
		if _, err := os.Stat(src.path); errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("open registry %s: %w (the file does not exist)", src.display, ErrNoSchema)
		}
	}
	if opts.ReadOnly {
		src = src.readOnly()
	}
	db, err := openDB(src, opts.Password)
	if err != nil {
		return nil, fmt.Errorf("open registry %s: %w", src.display, err)
	}
	db.SetMaxOpenConns(cmp.Or(opts.MaxOpenConns, src.dialect.maxOpenConns))
	db.SetMaxIdleConns(cmp.Or(opts.MaxIdleConns, src.dialect.maxIdleConns))
	db.SetConnMaxLifetime(cmp.Or(opts.ConnMaxLifetime, 30*time.Minute))
	r := &Registry{db: db, dialect: src.dialect, display: src.display, now: opts.Now, actor: opts.Actor,
		lease: cmp.Or(opts.LeaseDuration, DefaultLeaseDuration), lockWait: cmp.Or(opts.LockWait, DefaultLockWait)}
	if !opts.ReadOnly {
		r.writer = make(chan struct{}, 1)
	}
	if r.now == nil {
		r.now = time.Now
	}
	if r.actor == "" {
		r.actor, _ = os.Hostname()
		r.actor = cmp.Or(r.actor, "unknown")
	}
	r.holder = r.actor + "#" + randomSuffix()
	if err := ping(ctx, db, src.dialect); err != nil {
		return nil, errors.Join(fmt.Errorf("open registry %s: %w", src.display, err), db.Close())
	}
	r.migrationLockTimeout = cmp.Or(opts.MigrationLockTimeout, 10*time.Second)
	switch {
	case opts.MigrateLater:
		if err := checkSchema(ctx, db, src.dialect); errors.Is(err, ErrSchemaNewer) {
			return nil, errors.Join(fmt.Errorf("open registry %s: %w", src.display, err), db.Close())
		}
		return r, nil
	case opts.ReadOnly || opts.KeepSchema:
		if err := checkSchema(ctx, db, src.dialect); err != nil {
			return nil, errors.Join(fmt.Errorf("open registry %s: %w", src.display, err), db.Close())
		}
		if err := r.prepare(ctx); err != nil {
			return nil, errors.Join(err, r.Close())
		}
		return r, nil
	}
	if err := r.Migrate(ctx); err != nil {
		return nil, errors.Join(err, r.Close())
	}
	return r, nil
}

// Migrate brings the schema of a registry opened with MigrateLater up to date and
// makes it ready to write; Open does it for a registry opened otherwise. Calling it
// again does nothing.
func (r *Registry) Migrate(ctx context.Context) error {
	r.prepareMu.Lock()
	defer r.prepareMu.Unlock()
	if r.get != nil {
		return nil
	}
	if err := migrate(ctx, r.db, r.dialect, r.now(), r.migrationLockTimeout); err != nil {
		return fmt.Errorf("migrate registry %s: %w", r.display, err)
	}
	return r.prepare(ctx)
}

// UseSchema makes a registry opened with MigrateLater ready to write without
// migrating it: ErrSchemaOlder when its schema is older than this program's,
// ErrNoSchema when it has none. Calling it after Migrate does nothing.
func (r *Registry) UseSchema(ctx context.Context) error {
	r.prepareMu.Lock()
	defer r.prepareMu.Unlock()
	if r.get != nil {
		return nil
	}
	if err := checkSchema(ctx, r.db, r.dialect); err != nil {
		return fmt.Errorf("open registry %s: %w", r.display, err)
	}
	return r.prepare(ctx)
}

// prepare prepares the statements of every sync: all of them, or on an error none.
func (r *Registry) prepare(ctx context.Context) error {
	d := r.dialect
	stmts := []struct {
		stmt  **sql.Stmt
		query string
	}{
		{&r.get, getSQL},
		{&r.insert, insertSQL},
		{&r.upsert, fmt.Sprintf(upsertSQL, fmt.Sprintf(d.validTime, "students.created_at"),
			fmt.Sprintf(d.notNewer, "students.generation", "excluded.generation"))},
		{&r.rewind, fmt.Sprintf(rewindSQL, fmt.Sprintf(d.validTime, "created_at"))},
		{&r.release, fmt.Sprintf(releaseSQL, fmt.Sprintf(d.validTime, "created_at"),
			fmt.Sprintf(d.notNewer, "generation", "$7"))},
		{&r.delPolicy, deletePolicySQL},
		{&r.releaseAsIs, fmt.Sprintf(releaseAsIsSQL, fmt.Sprintf(d.validTime, "created_at"))},
		{&r.fenceCheck, fenceCheckSQL},
		{&r.recordPolicy, recordPolicySQL},
		{&r.observe, observeSQL},
		{&r.adopt, adoptSQL},
		{&r.takeBack, fmt.Sprintf(takeBackSQL, fmt.Sprintf(d.validTime, "created_at"))},
		{&r.prune, pruneSQL},
		{&r.keepAsItStands, keepAsItStandsSQL},
		{&r.history, historyInsertSQL},
	}
	prepared := make([]*sql.Stmt, 0, len(stmts))
	for _, p := range stmts {
		stmt, err := r.db.PrepareContext(ctx, p.query)
		if err != nil {
			for _, done := range prepared {
				_ = done.Close()
			}
			return fmt.Errorf("open registry %s: prepare statements: %w", r.display, err)
		}
		prepared = append(prepared, stmt)
	}
	for i, p := range stmts {
		*p.stmt = prepared[i]
	}
	return nil
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
	var errs []error
	for _, stmt := range []*sql.Stmt{r.get, r.insert, r.upsert, r.rewind, r.release, r.delPolicy, r.releaseAsIs, r.recordPolicy, r.observe, r.adopt, r.takeBack, r.prune, r.keepAsItStands, r.fenceCheck, r.history} {
		if stmt != nil {
			errs = append(errs, stmt.Close())
		}
	}
	return errors.Join(append(errs, r.db.Close())...)
}

// CheckSchema reports whether the registry's schema is still the one this program
// knows: ErrSchemaNewer once a newer program has migrated it, which this one must not
// write to.
func (r *Registry) CheckSchema(ctx context.Context) error {
	if err := checkSchema(ctx, r.db, r.dialect); err != nil && !errors.Is(err, ErrSchemaOlder) {
		return fmt.Errorf("registry %s: %w", r.display, err)
	}
	return nil
}

// Ping reports whether the database answers.
func (r *Registry) Ping(ctx context.Context) error { return r.db.PingContext(ctx) }

// scanRecord reads one row. The columns are scanned as they come and decoded here, so
// that a row another system wrote past the schema is an ErrMalformed naming its uid,
// not a failed query.
func scanRecord(row interface{ Scan(...any) error }) (Record, error) {
	var v [15]any
	if err := row.Scan(&v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9], &v[10], &v[11], &v[12], &v[13], &v[14]); err != nil {
		return Record{}, err
	}
	var d decoder
	rec := Record{
		UID:            d.text(v[0], "uid", true),
		Namespace:      d.text(v[1], "namespace", true),
		Name:           d.text(v[2], "name", true),
		StudentName:    d.text(v[3], "student_name", false),
		School:         d.text(v[4], "school", false),
		Owner:          d.optionalText(v[5], "owner"),
		Generation:     d.integer(v[6], "generation"),
		CreatedAt:      d.time(v[7], "created_at", true),
		UpdatedAt:      d.time(v[8], "updated_at", true),
		ReleasedAt:     d.time(v[9], "released_at", false),
		DeletionPolicy: d.policy(v[10]),
		Management:     d.management(v[11]),
		ReleasedBy:     d.optionalText(v[12], "released_by"),
		ReleaseCause:   d.optionalText(v[13], "release_cause"),
		StudentUID:     d.optionalText(v[14], "student_uid"),
	}
	if len(d.problems) > 0 {
		return Record{}, &malformedError{row: MalformedRow{UID: rec.UID, Problem: strings.Join(d.problems, "; ")}}
	}
	return rec, nil
}

// malformedError is ErrMalformed for one row.
type malformedError struct{ row MalformedRow }

func (e *malformedError) Error() string {
	return fmt.Sprintf("row %q cannot be read: %s", e.row.UID, e.row.Problem)
}

func (e *malformedError) Unwrap() error { return ErrMalformed }

// decoder turns the values database/sql hands over into a Record's fields, and notes
// each one that does not fit.
type decoder struct{ problems []string }

func (d *decoder) text(v any, column string, nonEmpty bool) string {
	switch v := v.(type) {
	case string:
		if nonEmpty && v == "" {
			d.problems = append(d.problems, column+" is empty")
		}
		return v
	case nil:
		d.problems = append(d.problems, column+" is NULL")
	default:
		d.problems = append(d.problems, fmt.Sprintf("%s holds %s, not text", column, describe(v)))
	}
	return ""
}

func (d *decoder) optionalText(v any, column string) string {
	if v == nil {
		return ""
	}
	return d.text(v, column, false)
}

// policy reads deletion_policy; a value the schema would refuse reads as unknown,
// which releases rather than deletes.
func (d *decoder) policy(v any) string {
	if p, ok := v.(string); ok && (p == PolicyDelete || p == PolicyOrphan) {
		return p
	}
	return ""
}

// management reads management; a value the schema would refuse reads as observed,
// which no path lets go without its Student.
func (d *decoder) management(v any) string {
	if v == nil {
		return ""
	}
	return ManagementObserve
}

func (d *decoder) integer(v any, column string) int64 {
	if n, ok := v.(int64); ok {
		return n
	}
	d.problems = append(d.problems, fmt.Sprintf("%s holds %s, not an integer", column, describe(v)))
	return 0
}

func (d *decoder) time(v any, column string, required bool) time.Time {
	switch v := v.(type) {
	case time.Time:
		return v.UTC()
	case nil:
		if required {
			d.problems = append(d.problems, column+" is NULL")
		}
	default:
		d.problems = append(d.problems, fmt.Sprintf("%s holds %s, not a time", column, describe(v)))
	}
	return time.Time{}
}

// describe shows a stored value in a problem: strings quoted and cut short, since
// they come from whoever wrote the row.
func describe(v any) string {
	switch v := v.(type) {
	case nil:
		return "NULL"
	case string:
		if len(v) > 40 {
			v = v[:40] + "..."
		}
		return strconv.Quote(v)
	case []byte:
		return fmt.Sprintf("a %d-byte blob", len(v))
	default:
		return fmt.Sprintf("%v (%T)", v, v)
	}
}

// Get returns the row for uid, or ErrNotFound, or ErrMalformed when the row cannot be
// read.
func (r *Registry) Get(ctx context.Context, uid string) (Record, error) {
	rec, err := scanRecord(r.get.QueryRowContext(ctx, uid))
	if errors.Is(err, sql.ErrNoRows) {
		return Record{}, fmt.Errorf("uid %s: %w", uid, ErrNotFound)
	}
	if errors.Is(err, ErrMalformed) {
		return Record{}, err
	}
	if err != nil {
		return Record{}, fmt.Errorf("get row %s: %w", uid, err)
	}
	return rec, nil
}

// List returns the rows that owner owns, by namespace and name, and apart from them
// the owned rows it cannot read: one such row does not keep the caller from the rest.
func (r *Registry) List(ctx context.Context, owner string) ([]Record, []MalformedRow, error) {
	out, malformed, err := r.query(ctx, r.dialect.listOwned, owner)
	if err != nil {
		return nil, nil, fmt.Errorf("list rows of %q: %w", owner, err)
	}
	if r.dialect.sortList {
		slices.SortFunc(out, func(a, b Record) int {
			return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name), strings.Compare(a.UID, b.UID))
		})
	}
	return out, malformed, nil
}

// query runs a SELECT of columns and reads its rows, and apart from them the ones it
// cannot read.
func (r *Registry) query(ctx context.Context, query string, args ...any) ([]Record, []MalformedRow, error) {
	rows, err := r.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	var out []Record
	var malformed []MalformedRow
	for rows.Next() {
		rec, err := scanRecord(rows)
		var bad *malformedError
		if errors.As(err, &bad) {
			malformed = append(malformed, bad.row)
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		out = append(out, rec)
	}
	return out, malformed, rows.Err()
}

// Insert writes rec as the new row of rec.UID, owned by rec.Owner, and returns it as
// stored; a history row records it as created, for cause. It is the write of a Student
// that has had no row, without the read that Upsert's callers make first: when the
// registry holds a row for rec.UID after all (written by a sync that ended before it
// could report it, another owner's, a released or malformed one), Insert changes
// nothing and returns ErrExists, and the caller reads that row and decides.
func (r *Registry) Insert(ctx context.Context, rec Record, cause string) (Record, error) {
	if err := requireKey("insert", rec); err != nil {
		return Record{}, err
	}
	now := r.now().UTC()
	var created, updated time.Time
	err := r.write(ctx, now, func(ctx context.Context, in func(*sql.Stmt) *sql.Stmt) ([]entry, error) {
		// No row returned: one was there. As an error, it ends the write like any
		// other that fails: rolled back, with no fence check or commit of its own.
		if err := in(r.insert).QueryRowContext(ctx, append(rowValues(rec, now), optional(rec.StudentUID))...).Scan(&created, &updated); err != nil {
			return nil, err
		}
		return []entry{entryOf(rec, ActionCreated, cause)}, nil
	})
	switch {
	case errors.Is(err, ErrFenced):
		return Record{}, err
	case errors.Is(err, sql.ErrNoRows):
		return Record{}, fmt.Errorf("insert row %s: %w", rec.UID, ErrExists)
	case err != nil:
		return Record{}, fmt.Errorf("insert row %s: %w", rec.UID, err)
	}
	return asStored(rec, created, updated), nil
}

// Upsert writes rec as rec.Owner: it inserts the row, or updates it when rec.Owner
// owns it, and returns the row as stored; a history row records why. A row with
// another owner, or a released one, is left alone and ErrNotOwned returned; a row that
// holds a newer generation than rec is left alone and ErrStale returned.
func (r *Registry) Upsert(ctx context.Context, rec Record, why Why) (Record, error) {
	if err := requireKey("upsert", rec); err != nil {
		return Record{}, err
	}
	action := cmp.Or(why.Action, ActionUpdated)
	if action != ActionCreated && action != ActionUpdated && action != ActionRestored {
		return Record{}, fmt.Errorf("upsert row %s: the action %q is none of %s, %s, %s", rec.UID, action, ActionCreated, ActionUpdated, ActionRestored)
	}
	now := r.now().UTC()
	var created, updated time.Time
	err := r.write(ctx, now, func(ctx context.Context, in func(*sql.Stmt) *sql.Stmt) ([]entry, error) {
		if why.KeepObserved && writeHistory {
			if _, err := in(r.keepAsItStands).ExecContext(ctx, now, rec.Owner, r.actor, rec.UID, CauseBeforeManaged); err != nil {
				return nil, fmt.Errorf("keep the observed row in the history: %w", err)
			}
		}
		err := in(r.upsert).QueryRowContext(ctx, append(rowValues(rec, now), optional(rec.StudentUID))...).Scan(&created, &updated)
		if err != nil {
			return nil, err
		}
		return []entry{entryOf(rec, action, why.Cause)}, nil
	})
	if errors.Is(err, ErrFenced) {
		return Record{}, err
	}
	if errors.Is(err, sql.ErrNoRows) {
		return Record{}, r.notWritten(ctx, rec)
	}
	if err != nil {
		return Record{}, fmt.Errorf("upsert row %s: %w", rec.UID, err)
	}
	return asStored(rec, created, updated), nil
}

// Rewind writes rec over rec.Owner's row for rec.UID that holds generation ahead,
// newer than rec's, and returns the row as stored; a history row records it as
// updated, for CauseRegistryAhead. It is the one write that takes a row back in
// generation, for a registry that has seen a future the cluster lost (an etcd
// restore): its caller has read the row, then confirmed with the API server that the
// Student is at rec's generation. A row that no longer holds ahead, or is not the
// owner's, is left alone: ErrNotOwned, ErrNotFound, or an error to try again.
func (r *Registry) Rewind(ctx context.Context, rec Record, ahead int64) (Record, error) {
	if err := requireKey("rewind", rec); err != nil {
		return Record{}, err
	}
	if ahead <= rec.Generation {
		return Record{}, fmt.Errorf("rewind row %s: generation %d is not ahead of %d", rec.UID, ahead, rec.Generation)
	}
	now := r.now().UTC()
	var created, updated time.Time
	err := r.write(ctx, now, func(ctx context.Context, in func(*sql.Stmt) *sql.Stmt) ([]entry, error) {
		err := in(r.rewind).QueryRowContext(ctx, append(rowValues(rec, now), ahead)...).Scan(&created, &updated)
		if err != nil {
			return nil, err
		}
		return []entry{entryOf(rec, ActionUpdated, CauseRegistryAhead)}, nil
	})
	switch {
	case errors.Is(err, ErrFenced):
		return Record{}, err
	case errors.Is(err, sql.ErrNoRows):
		// Not the generation it was found at: whatever it is now, the caller reads
		// it again (no generation here, so not ErrStale).
		return Record{}, r.notWritten(ctx, Record{UID: rec.UID, Owner: rec.Owner})
	case err != nil:
		return Record{}, fmt.Errorf("rewind row %s: %w", rec.UID, err)
	}
	return asStored(rec, created, updated), nil
}

// requireKey refuses a write of rec (op names it) without the uid and owner every row
// needs.
func requireKey(op string, rec Record) error {
	if rec.UID == "" || rec.Owner == "" {
		return fmt.Errorf("%s row: uid and owner are required (uid %q, owner %q)", op, rec.UID, rec.Owner)
	}
	return nil
}

// rowValues are the values that Insert, Upsert and Rewind write for rec at now, in their
// statements' order.
func rowValues(rec Record, now time.Time) []any {
	return []any{rec.UID, rec.Namespace, rec.Name, rec.StudentName, rec.School, rec.Owner, rec.Generation, now, policyValue(rec.DeletionPolicy)}
}

// optional is s, or NULL when it is empty.
func optional(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// asStored is rec as Insert or Upsert stored it, with the times its statement returned.
func asStored(rec Record, created, updated time.Time) Record {
	rec.CreatedAt, rec.UpdatedAt = created.UTC(), updated.UTC()
	rec.ReleasedAt, rec.ReleasedBy, rec.ReleaseCause = time.Time{}, "", ""
	rec.DeletionPolicy = policyOf(rec.DeletionPolicy)
	return rec
}

// policyValue is what a write stores for a policy: NULL when unknown.
func policyValue(p string) any {
	if p = policyOf(p); p == "" {
		return nil
	}
	return p
}

// managementValue is what a write stores for a management: NULL for a managed row.
func managementValue(m string) any {
	if m == "" {
		return nil
	}
	return ManagementObserve
}

// policyOf keeps only the policies the schema takes.
func policyOf(p string) string {
	if p == PolicyDelete || p == PolicyOrphan {
		return p
	}
	return ""
}

// Delete lets owner's row for uid go for its Student's finalizer (cause): the one
// path that destroys a row, and only one whose recorded policy is Delete. A row of the
// owner that records another policy, or none, is released as it stands. A missing
// row is no error (Absent: the delete already happened); a row with another owner, or
// already released, is ErrNotOwned; an observed one ErrObserved. A history row gives
// cause.
func (r *Registry) Delete(ctx context.Context, uid, owner, cause string) (Outcome, error) {
	return r.letGo(ctx, uid, owner, cause, true)
}

// Release gives up rec.Owner's claim on the row for rec.UID: the row stays, with the
// values of rec and no owner, and no controller changes it again; a history row gives
// cause. It reports whether a row was released: a missing row is no error; a row with
// another owner, or already released, is ErrNotOwned; a row that holds a newer
// generation than rec is ErrStale.
func (r *Registry) Release(ctx context.Context, rec Record, cause string) (bool, error) {
	now := r.now().UTC()
	var n int64
	err := r.write(ctx, now, func(ctx context.Context, in func(*sql.Stmt) *sql.Stmt) ([]entry, error) {
		e := entry{uid: rec.UID, action: ActionReleased, owner: rec.Owner, cause: cause}
		released, err := scanReturned(in(r.release).QueryRowContext(ctx, rec.UID, rec.Owner,
			rec.Namespace, rec.Name, rec.StudentName, rec.School, rec.Generation, now, causeValue(cause)), &e)
		if !released {
			return nil, err
		}
		n = 1
		return []entry{e}, nil
	})
	if err != nil {
		return false, fmt.Errorf("release row %s: %w", rec.UID, err)
	}
	return r.changedOrAbsent(ctx, n, rec)
}

// RecordPolicy records policy in owner's row for uid where the row records none yet
// (it was written before rows recorded it), and changes nothing else: updated_at says
// when the student's record last changed, and it did not. A history row
// (CausePolicyRecorded) records the policy set.
func (r *Registry) RecordPolicy(ctx context.Context, uid, owner, policy string) error {
	if policyOf(policy) == "" {
		return fmt.Errorf("record the deletion policy of row %s: %q is neither %s nor %s", uid, policy, PolicyDelete, PolicyOrphan)
	}
	err := r.write(ctx, r.now().UTC(), func(ctx context.Context, in func(*sql.Stmt) *sql.Stmt) ([]entry, error) {
		e := entry{uid: uid, action: ActionUpdated, owner: owner, cause: CausePolicyRecorded}
		recorded, err := scanReturned(in(r.recordPolicy).QueryRowContext(ctx, uid, owner, policy), &e)
		if !recorded {
			return nil, err
		}
		return []entry{e}, nil
	})
	if err != nil {
		return fmt.Errorf("record the deletion policy of row %s: %w", uid, err)
	}
	return nil
}

// MarkObserved marks owner's row for uid as observed (Record.Management), where it is
// managed, and changes nothing else; a history row (CauseObserved) records it. From
// then on no path that finds the row without its Student lets it go. A missing row is
// no error; another owner's, or a released one, is ErrNotOwned.
func (r *Registry) MarkObserved(ctx context.Context, uid, owner string) error {
	var n int64
	err := r.write(ctx, r.now().UTC(), func(ctx context.Context, in func(*sql.Stmt) *sql.Stmt) ([]entry, error) {
		e := entry{uid: uid, action: ActionUpdated, owner: owner, cause: CauseObserved}
		marked, err := scanReturned(in(r.observe).QueryRowContext(ctx, uid, owner), &e)
		if !marked {
			return nil, err
		}
		n = 1
		return []entry{e}, nil
	})
	if err != nil {
		return fmt.Errorf("mark row %s observed: %w", uid, err)
	}
	if n > 0 {
		return nil
	}
	// Not marked: gone, observed already, or not owner's.
	err = r.notWritten(ctx, Record{UID: uid, Owner: owner})
	if errors.Is(err, ErrNotFound) || errors.Is(err, ErrObserved) {
		return nil
	}
	return fmt.Errorf("mark row %s observed: %w", uid, err)
}

// Outcome is what Delete or Relinquish did to a row.
type Outcome string

const (
	// Absent: there was no row.
	Absent Outcome = ""
	// Deleted: the row recorded the Delete policy and is gone (Delete only).
	Deleted Outcome = "deleted"
	// Released: the row was released as it stood, its policy kept.
	Released Outcome = "released"
)

// Relinquish gives up owner's row for uid found without its Student (cause: the
// sweep, a stale cache): the row is released as it stands, whatever policy it
// records, which it keeps (Record.ReleasedBy, Record.ReleaseCause say who and why).
// Absence is no evidence that the Student was deleted (a forced finalizer removal,
// an older backup put back, a cluster clone torn down, the CRD deleted), so no such
// path deletes a row: Prune does, when an operator asks. A row with another owner, or
// already released, is ErrNotOwned; an observed one ErrObserved. A history row gives
// cause.
func (r *Registry) Relinquish(ctx context.Context, uid, owner, cause string) (Outcome, error) {
	return r.letGo(ctx, uid, owner, cause, false)
}

// letGo is Delete (mayDelete) and Relinquish.
func (r *Registry) letGo(ctx context.Context, uid, owner, cause string, mayDelete bool) (Outcome, error) {
	var deleted, released int64
	now := r.now().UTC()
	err := r.write(ctx, now, func(ctx context.Context, in func(*sql.Stmt) *sql.Stmt) ([]entry, error) {
		e := entry{uid: uid, action: ActionDeleted, owner: owner, cause: cause}
		if mayDelete {
			ok, err := scanReturned(in(r.delPolicy).QueryRowContext(ctx, uid, owner), &e)
			if err != nil {
				return nil, err
			}
			if ok {
				deleted = 1
				return []entry{e}, nil
			}
		}
		e.action = ActionReleased
		if ok, err := scanReturned(in(r.releaseAsIs).QueryRowContext(ctx, uid, owner, now, causeValue(cause)), &e); !ok {
			return nil, err
		}
		released = 1
		return []entry{e}, nil
	})
	switch {
	case err != nil:
		return Absent, fmt.Errorf("let go of row %s: %w", uid, err)
	case deleted > 0:
		return Deleted, nil
	}
	ok, err := r.changedOrAbsent(ctx, released, Record{UID: uid, Owner: owner})
	if !ok {
		return Absent, err
	}
	return Released, nil
}

// causeValue is what a release records as its cause: "unspecified" when empty, as
// the history does.
func causeValue(cause string) string { return cmp.Or(cause, "unspecified") }

// TakeBack owns and writes again the row for rec.UID that rec.Owner released, and
// returns it as stored; a history row records it as restored, for cause, after one
// that keeps the released row as it stood (CauseBeforeTakenBack). It is for a
// Student of the row's uid that is live after its row was let go: an etcd restore
// brought back a Student whose finalizer had released the row. A row that is not
// released by rec.Owner (owned again, another owner's, adopted, observed) is left
// alone: ErrNotOwned, ErrNotFound or ErrObserved.
func (r *Registry) TakeBack(ctx context.Context, rec Record, cause string) (Record, error) {
	if err := requireKey("take back", rec); err != nil {
		return Record{}, err
	}
	now := r.now().UTC()
	var created, updated time.Time
	err := r.write(ctx, now, func(ctx context.Context, in func(*sql.Stmt) *sql.Stmt) ([]entry, error) {
		if writeHistory {
			if _, err := in(r.keepAsItStands).ExecContext(ctx, now, rec.Owner, r.actor, rec.UID, CauseBeforeTakenBack); err != nil {
				return nil, fmt.Errorf("keep the released row in the history: %w", err)
			}
		}
		if err := in(r.takeBack).QueryRowContext(ctx, rowValues(rec, now)...).Scan(&created, &updated); err != nil {
			return nil, err
		}
		return []entry{entryOf(rec, ActionRestored, cause)}, nil
	})
	switch {
	case errors.Is(err, ErrFenced):
		return Record{}, err
	case errors.Is(err, sql.ErrNoRows):
		stored, err := r.Get(ctx, rec.UID)
		switch {
		case err != nil:
			return Record{}, fmt.Errorf("take back row %s: %w", rec.UID, err)
		case stored.Owner != "":
			return Record{}, fmt.Errorf("take back row %s: it is owned by %q: %w", rec.UID, stored.Owner, ErrNotOwned)
		case stored.Management == ManagementObserve:
			return Record{}, fmt.Errorf("take back row %s: %w", rec.UID, ErrObserved)
		}
		return Record{}, fmt.Errorf("take back row %s: released by %q, not %q: %w", rec.UID, stored.ReleasedBy, rec.Owner, ErrNotOwned)
	case err != nil:
		return Record{}, fmt.Errorf("take back row %s: %w", rec.UID, err)
	}
	return asStored(rec, created, updated), nil
}

// ListReleased returns the rows that owner released and nobody has taken since, by
// namespace, name and UID, and apart from them the ones it cannot read.
func (r *Registry) ListReleased(ctx context.Context, owner string) ([]Record, []MalformedRow, error) {
	out, malformed, err := r.query(ctx, `SELECT `+columns+` FROM students WHERE owner IS NULL AND released_by = $1`, owner)
	if err != nil {
		return nil, nil, fmt.Errorf("list rows released by %q: %w", owner, err)
	}
	slices.SortFunc(out, func(a, b Record) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name), strings.Compare(a.UID, b.UID))
	})
	return out, malformed, nil
}

// prunableCauses are the causes of a release that Prune undoes: the row was let go
// without a user's word that it should go, while it recorded the Delete policy.
var prunableCauses = []string{CauseSweep, CauseStaleCache, CauseCRDDeleted, CauseRegistryBehind}

// pruneSQL is Prune's: a row that owner $2 released for one of prunableCauses while
// it recorded the Delete policy, and that is still so.
var pruneSQL = `DELETE FROM students WHERE uid = $1 AND owner IS NULL AND released_by = $2 AND deletion_policy = 'Delete'
	AND management IS NULL AND release_cause IN ('` + strings.Join(prunableCauses, "', '") + `')` + returned

// Prunable says whether Prune deletes rec for owner: the same test as pruneSQL's.
func Prunable(rec Record, owner string) bool {
	return rec.Owner == "" && rec.ReleasedBy == owner && rec.DeletionPolicy == PolicyDelete && rec.Management == "" &&
		slices.Contains(prunableCauses, rec.ReleaseCause)
}

// Prune deletes the row for uid when it is still Prunable for owner, with a history row
// (ActionDeleted, CausePrune); it reports whether it did. It is the explicit delete of
// a row that absence released (student-controller registry prune).
func (r *Registry) Prune(ctx context.Context, uid, owner string) (bool, error) {
	var n int64
	err := r.write(ctx, r.now().UTC(), func(ctx context.Context, in func(*sql.Stmt) *sql.Stmt) ([]entry, error) {
		e := entry{uid: uid, action: ActionDeleted, owner: owner, cause: CausePrune}
		deleted, err := scanReturned(in(r.prune).QueryRowContext(ctx, uid, owner), &e)
		if !deleted {
			return nil, err
		}
		n = 1
		return []entry{e}, nil
	})
	if err != nil {
		return false, fmt.Errorf("prune row %s: %w", uid, err)
	}
	return n > 0, nil
}

// affected is the number of rows a statement changed.
func affected(res sql.Result, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// changedOrAbsent reports whether a delete or release of rec changed a row (n rows): a
// missing row is no error, anything else that stopped it is (see notWritten).
func (r *Registry) changedOrAbsent(ctx context.Context, n int64, rec Record) (bool, error) {
	if n > 0 {
		return true, nil
	}
	err := r.notWritten(ctx, rec)
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	return false, err
}

// notWritten explains why a write guarded by owner and generation changed nothing.
func (r *Registry) notWritten(ctx context.Context, want Record) error {
	uid := want.UID
	rec, err := r.Get(ctx, uid)
	switch {
	case errors.Is(err, ErrMalformed):
		return fmt.Errorf("%w, and is not this owner's: %w", err, ErrNotOwned)
	case err != nil:
		return err
	case rec.Owner == "":
		return fmt.Errorf("row %s was released at %s: %w", uid, rec.ReleasedAt.Format(time.RFC3339), ErrNotOwned)
	case rec.Owner != want.Owner:
		return fmt.Errorf("row %s is owned by %q: %w", uid, rec.Owner, ErrNotOwned)
	case rec.Management == ManagementObserve && want.Generation == 0:
		// Only Relinquish, which carries no generation, leaves observed rows alone.
		return fmt.Errorf("row %s: %w", uid, ErrObserved)
	case want.Generation > 0 && rec.Generation > want.Generation:
		// Only writes that carry a generation are guarded by it; Delete carries none (0).
		return fmt.Errorf("row %s holds generation %d, the write %d: %w", uid, rec.Generation, want.Generation, ErrStale)
	}
	// Changed in between (the row came back, or its generation moved): the caller retries.
	return fmt.Errorf("row %s changed while it was written; try again", uid)
}
