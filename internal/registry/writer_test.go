package registry

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/student-controller/student-controller/internal/testenv/pgtest"
	"github.com/student-controller/student-controller/internal/testenv/registrytest"
)

// writeBackends runs test on a fresh registry of each kind: a SQLite file, and a
// database on a PostgreSQL server of the test's own. It gets the registry's URL and a
// connection to its database as another program would have.
func writeBackends(t *testing.T, test func(t *testing.T, url string, db *sql.DB)) {
	t.Run("sqlite", func(t *testing.T) {
		url, db := registrytest.SQLiteBackend().New(t)
		test(t, url, db)
	})
	t.Run("postgres", func(t *testing.T) {
		url, db := registrytest.NewDatabase(t, pgtest.ForTest(t))
		test(t, url, db)
	})
}

// TestWritesTakeTurns: a registry's writes from many goroutines at once take turns in
// the process (Registry.writer) and all land, each with its history row; a write
// waiting for its turn gives up with its context and writes nothing.
func TestWritesTakeTurns(t *testing.T) {
	writeBackends(t, testWritesTakeTurns)
}

func testWritesTakeTurns(t *testing.T, url string, _ *sql.DB) {
	ctx := context.Background()
	r, err := Open(ctx, url, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.writer == nil {
		t.Fatal("a writable registry has no turn to take")
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

// TestGroupCommit: writes that wait for the turn together go in one transaction, and
// each gets its own outcome: one that fails (a row of another owner, a stale
// generation) is rolled back alone and the others land with their history rows; a
// fence taken by another controller since rolls back the whole group. (A write that
// gives up while it waits is TestWritesTakeTurns'.)
func TestGroupCommit(t *testing.T) {
	writeBackends(t, testGroupCommit)
}

func testGroupCommit(t *testing.T, url string, _ *sql.DB) {
	ctx := context.Background()
	r, err := Open(ctx, url, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.TakeFence(ctx, "test"); err != nil {
		t.Fatal(err)
	}
	record := func(uid, owner string, generation int64) Record {
		return Record{UID: uid, Namespace: "default", Name: "s-" + uid, StudentName: "张三", School: "深圳中学",
			Owner: owner, Generation: generation, DeletionPolicy: PolicyDelete}
	}
	// Rows the group's writes meet: one of another owner, one at generation 5.
	if _, err := r.Upsert(ctx, record("theirs", "other", 1), Why{Cause: "test"}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Upsert(ctx, record("newer", "test", 5), Why{Cause: "test"}); err != nil {
		t.Fatal(err)
	}
	history := func() int {
		t.Helper()
		var n int
		if err := r.db.QueryRowContext(ctx, `SELECT count(*) FROM student_history`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	historyBefore := history()

	upsert := func(rec Record) func() error {
		return func() error { _, err := r.Upsert(ctx, rec, Why{Cause: "test"}); return err }
	}
	insert := func(rec Record) func() error {
		return func() error { _, err := r.Insert(ctx, rec, "test"); return err }
	}
	transactions := r.transactions.Load()
	got := together(t, r, map[string]func() error{
		"a":      upsert(record("a", "test", 1)),
		"b":      upsert(record("b", "test", 1)),
		"theirs": upsert(record("theirs", "test", 2)),
		"newer":  upsert(record("newer", "test", 3)),
		"c":      upsert(record("c", "test", 1)),
		// Inserts: one new row, one that finds its row there and writes nothing.
		"ins":            insert(record("ins", "test", 1)),
		"newer (insert)": insert(record("newer", "test", 1)),
	})
	if n := r.transactions.Load() - transactions; n != 1 {
		t.Errorf("the group took %d transactions, want 1", n)
	}
	for uid, want := range map[string]error{"a": nil, "b": nil, "c": nil, "ins": nil, "theirs": ErrNotOwned, "newer": ErrStale, "newer (insert)": ErrExists} {
		if err := got[uid]; !errors.Is(err, want) || want == nil && err != nil {
			t.Errorf("the write of %s: %v, want %v", uid, err, want)
		}
	}
	for uid, want := range map[string]Record{"a": record("a", "test", 1), "b": record("b", "test", 1), "c": record("c", "test", 1),
		"ins": record("ins", "test", 1), "theirs": record("theirs", "other", 1), "newer": record("newer", "test", 5)} {
		row, err := r.Get(ctx, uid)
		if err != nil || row.Owner != want.Owner || row.Generation != want.Generation {
			t.Errorf("row %s: owner %q, generation %d (%v); want %q, %d", uid, row.Owner, row.Generation, err, want.Owner, want.Generation)
		}
	}
	if writeHistory {
		if n := history() - historyBefore; n != 4 {
			t.Errorf("%d history rows written by the group, want 4 (a, b, c, ins)", n)
		}
	}

	// A write whose row is written and whose history row then fails is undone to its
	// savepoint, row and all; the others of its group land. (The trigger's error
	// undoes the failing statement alone, as most errors do on SQLite; PostgreSQL's
	// transaction takes no statement after an error until it rolls back to the
	// savepoint.)
	exec := func(queries ...string) {
		t.Helper()
		for _, query := range queries {
			if _, err := r.db.ExecContext(ctx, query); err != nil {
				t.Fatal(err)
			}
		}
	}
	// trigger makes an insert of uid into the history run body (SQLite) or call
	// function (PostgreSQL); the returned func removes it.
	trigger := func(name, uid, body, function string) func() {
		t.Helper()
		if r.dialect == sqlite {
			exec(`CREATE TRIGGER ` + name + ` BEFORE INSERT ON student_history WHEN NEW.uid = '` + uid + `' BEGIN ` + body + `; END`)
			return func() { exec(`DROP TRIGGER ` + name) }
		}
		exec(`CREATE FUNCTION `+name+`() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN `+function+`; RETURN NEW; END $$`,
			`CREATE TRIGGER `+name+` BEFORE INSERT ON student_history FOR EACH ROW WHEN (NEW.uid = '`+uid+`') EXECUTE FUNCTION `+name+`()`)
		return func() { exec(`DROP TRIGGER `+name+` ON student_history`, `DROP FUNCTION `+name+`()`) }
	}
	drop := trigger("poison", "poison", `SELECT RAISE(ABORT, 'poisoned history')`, `RAISE EXCEPTION 'poisoned history'`)
	got = together(t, r, map[string]func() error{"f": upsert(record("f", "test", 1)), "poison": upsert(record("poison", "test", 1)), "g": upsert(record("g", "test", 1))})
	drop()
	if err := got["poison"]; err == nil || !strings.Contains(err.Error(), "poisoned history") {
		t.Errorf("the write whose history failed: %v, want the trigger's error", err)
	}
	if _, err := r.Get(ctx, "poison"); !errors.Is(err, ErrNotFound) {
		t.Errorf("the row of the write whose history failed: %v, want ErrNotFound (rolled back to its savepoint)", err)
	}
	for _, uid := range []string{"f", "g"} {
		if _, err := r.Get(ctx, uid); got[uid] != nil || err != nil {
			t.Errorf("write %s beside the failing one: %v, then Get: %v; want it written", uid, got[uid], err)
		}
	}

	// An error that ends the whole transaction (SQLite's ROLLBACK in the trigger, as a
	// full disk would; PostgreSQL's session ended under it, as a lost connection would)
	// fails every write of the group: none is written, none is told it was.
	drop = trigger("doom", "doom", `SELECT RAISE(ROLLBACK, 'doomed')`, `PERFORM pg_terminate_backend(pg_backend_pid())`)
	got = together(t, r, map[string]func() error{"h": upsert(record("h", "test", 1)), "doom": upsert(record("doom", "test", 1)), "i": upsert(record("i", "test", 1))})
	drop()
	for _, uid := range []string{"h", "doom", "i"} {
		if got[uid] == nil {
			t.Errorf("write %s in the transaction that ended: no error, want one", uid)
		}
		if _, err := r.Get(ctx, uid); !errors.Is(err, ErrNotFound) {
			t.Errorf("row %s after its transaction ended: %v, want ErrNotFound", uid, err)
		}
	}

	// More writes than one transaction takes: the rest go in the next.
	many := map[string]func() error{}
	for i := range maxGroup + 6 {
		uid := fmt.Sprintf("m-%d", i)
		many[uid] = upsert(record(uid, "test", 1))
	}
	transactions = r.transactions.Load()
	for uid, err := range together(t, r, many) {
		if err != nil {
			t.Errorf("write %s of a long line: %v", uid, err)
		}
	}
	if n := r.transactions.Load() - transactions; n != 2 {
		t.Errorf("%d writes took %d transactions, want 2", maxGroup+6, n)
	}

	// Another controller takes the owner's fence (this one gave it back): a whole
	// group is rolled back.
	if err := r.ReleaseFence(ctx); err != nil {
		t.Fatal(err)
	}
	next, err := Open(ctx, url, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	if _, err := next.TakeFence(ctx, "test"); err != nil {
		t.Fatal(err)
	}
	historyBefore = history()
	got = together(t, r, map[string]func() error{"d": upsert(record("d", "test", 1)), "e": upsert(record("e", "test", 1))})
	for _, uid := range []string{"d", "e"} {
		if !errors.Is(got[uid], ErrFenced) {
			t.Errorf("the fenced write of %s: %v, want ErrFenced", uid, got[uid])
		}
		if _, err := r.Get(ctx, uid); !errors.Is(err, ErrNotFound) {
			t.Errorf("row %s after the fenced group: %v, want ErrNotFound", uid, err)
		}
	}
	if n := history() - historyBefore; n != 0 {
		t.Errorf("%d history rows written by the fenced group, want 0", n)
	}
}

// TestGroupGivesUp: a group's transaction runs on while one of its writes still
// waits for it, and ends once all have given up, so that a server that stopped
// answering does not keep the turn, and every write behind it. Here another session
// holds the lock of the fence's row, which PostgreSQL's fence check waits for.
func TestGroupGivesUp(t *testing.T) {
	ctx := context.Background()
	r, db := fencedPostgres(t)
	record := func(uid string) Record {
		return Record{UID: uid, Namespace: "default", Name: uid, StudentName: "张三", School: "深圳中学",
			Owner: "test", Generation: 1, DeletionPolicy: PolicyDelete}
	}
	// lock locks the rows query selects FOR UPDATE, from another session.
	const fenceRow = `SELECT token FROM fences WHERE owner = 'test' FOR UPDATE`
	lock := func(query string) (release func()) {
		t.Helper()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, query); err != nil {
			t.Fatal(err)
		}
		var once sync.Once
		release = func() { once.Do(func() { _ = tx.Rollback() }) }
		t.Cleanup(release)
		return release
	}
	// upsertWithin writes uid in the group while it may wait that long.
	upsertWithin := func(uid string, wait time.Duration) (time.Duration, error) {
		short, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		started := time.Now()
		_, err := r.Upsert(short, record(uid), Why{Cause: "test"})
		return time.Since(started), err
	}

	type result struct {
		err  error
		took time.Duration
	}
	// inGroup writes each uid in one group, each while it may wait its time.
	inGroup := func(waits map[string]time.Duration) map[string]result {
		t.Helper()
		var mu sync.Mutex
		took := map[string]time.Duration{}
		writes := map[string]func() error{}
		for uid, wait := range waits {
			writes[uid] = func() error {
				d, err := upsertWithin(uid, wait)
				mu.Lock()
				took[uid] = d
				mu.Unlock()
				return err
			}
		}
		got := map[string]result{}
		for uid, err := range together(t, r, writes) {
			got[uid] = result{err, took[uid]}
		}
		return got
	}

	// Two writes in one group; one gives up after 2 s, the other may wait 30 s. The
	// lock goes after 3 s, well within the lock wait (DefaultLockWait, 5 s): the
	// transaction was still running, and both land.
	release := lock(fenceRow)
	time.AfterFunc(3*time.Second, release)
	for uid, got := range inGroup(map[string]time.Duration{"short": 2 * time.Second, "long": 30 * time.Second}) {
		if got.err != nil {
			t.Errorf("the write of %s, in the group that one write still waited for: %v after %v, want it written", uid, got.err, got.took)
		}
		if _, err := r.Get(ctx, uid); err != nil {
			t.Errorf("Get %s: %v, want its row", uid, err)
		}
	}

	// Two writes in one group that both give up, after 2 and 3 s, while the lock stays
	// for 20 s: the transaction ends, neither is written.
	release = lock(fenceRow)
	time.AfterFunc(20*time.Second, release)
	transactions := r.transactions.Load()
	for uid, got := range inGroup(map[string]time.Duration{"both-a": 2 * time.Second, "both-b": 3 * time.Second}) {
		if got.err == nil || got.took > 10*time.Second {
			t.Errorf("the write of %s, in a group whose writes all gave up: %v after %v, want an error within 10 s", uid, got.err, got.took)
		}
		if _, err := r.Get(ctx, uid); !errors.Is(err, ErrNotFound) {
			t.Errorf("Get %s: %v, want ErrNotFound", uid, err)
		}
	}
	if n := r.transactions.Load() - transactions; n != 1 {
		t.Errorf("the writes that both gave up took %d transactions, want 1", n)
	}
	release()

	// A row locked by another session for 40 s holds up one write of a group: that
	// write fails once it has waited DefaultLockWait for the lock, and the other lands,
	// long before either gives up.
	release = lock(`SELECT uid FROM students WHERE uid = 'short' FOR UPDATE`)
	time.AfterFunc(40*time.Second, release)
	results := inGroup(map[string]time.Duration{"short": 30 * time.Second, "free": 30 * time.Second})
	release()
	if got := results["short"]; got.err == nil || !strings.Contains(got.err.Error(), "lock timeout") || got.took > DefaultLockWait+10*time.Second {
		t.Errorf("the write of the locked row: %v after %v, want a lock timeout within %v", got.err, got.took, DefaultLockWait+10*time.Second)
	}
	if got := results["free"]; got.err != nil || got.took > DefaultLockWait+10*time.Second {
		t.Errorf("the write beside it: %v after %v, want it written within %v", got.err, got.took, DefaultLockWait+10*time.Second)
	}

	// A write alone that gives up after 500 ms: its transaction ends then, though the
	// lock stays for 20 s, and the next write takes the turn.
	release = lock(fenceRow)
	time.AfterFunc(20*time.Second, release)
	took, err := upsertWithin("alone", 500*time.Millisecond)
	if err == nil || took > 10*time.Second {
		t.Fatalf("the write that gave up after 500 ms: %v after %v, want an error within 10 s", err, took)
	}
	if _, err := r.Get(ctx, "alone"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get of the write that gave up: %v, want ErrNotFound", err)
	}
	release()
	if _, err := upsertWithin("next", 10*time.Second); err != nil {
		t.Errorf("the next write, once the lock is gone: %v", err)
	}
}

// TestRenewalTakesNoTurn: on PostgreSQL the fence's renewal does not wait for the
// workers' turn, which a group held up by a row's lock can keep for as long as its
// writes wait: the lease would run out under a live controller.
func TestRenewalTakesNoTurn(t *testing.T) {
	ctx := context.Background()
	r, _ := fencedPostgres(t)
	r.writer <- struct{}{} // a group holds the turn
	defer func() { <-r.writer }()
	short, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := r.RenewFence(short); err != nil {
		t.Fatalf("RenewFence while a group holds the turn: %v", err)
	}
}

// fencedPostgres opens a registry on a database of a PostgreSQL server of the test's
// own, holding owner "test"'s fence, and returns it with a connection to the database
// as another program would have.
func fencedPostgres(t *testing.T) (*Registry, *sql.DB) {
	t.Helper()
	ctx := context.Background()
	url, db := registrytest.NewDatabase(t, pgtest.ForTest(t))
	r, err := Open(ctx, url, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	if _, err := r.TakeFence(ctx, "test"); err != nil {
		t.Fatal(err)
	}
	return r, db
}

// together holds r's turn until every write waits for it, so that the one that takes
// it next writes them all, and returns each write's error by its key.
func together(t *testing.T, r *Registry, writes map[string]func() error) map[string]error {
	t.Helper()
	r.writer <- struct{}{}
	var mu sync.Mutex
	got := map[string]error{}
	var wg sync.WaitGroup
	for key, write := range writes {
		wg.Go(func() {
			err := write()
			mu.Lock()
			got[key] = err
			mu.Unlock()
		})
	}
	waitPending(t, r, len(writes))
	<-r.writer
	wg.Wait()
	return got
}

// waitPending waits until n writes wait for r's turn, which the test holds.
func waitPending(t *testing.T, r *Registry, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		r.pendingMu.Lock()
		waiting := len(r.pending)
		r.pendingMu.Unlock()
		if waiting == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d writes waiting after 10 s", waiting, n)
		}
	}
}
