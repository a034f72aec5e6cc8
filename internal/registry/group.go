package registry

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"
)

// Group commit. A registry's writes wait for one another (Registry.writer): SQLite
// has one writer at a time, and on PostgreSQL the write fence's check locks one row
// until the commit. Rather than one transaction, one commit and one sync to disk each,
// the writes that arrive while another's transaction runs wait together, and the next
// to take the turn writes them all in one transaction: each in a savepoint of its own,
// so that one that fails (a row of another owner, a stale generation) is rolled back
// alone, then the write fence's check and one commit for them all. Every write still
// returns only once it is committed (or failed), as before; only the waiting and the
// syncs are shared. On a machine whose cores are busy (the API server's), the turn's
// holder is often not running, and every write in the line waited for each holder in
// turn.

// maxGroup bounds the writes one transaction takes, so that a long line does not
// hold the lock for long: the rest go in the next.
const maxGroup = 64

// DefaultLockWait bounds how long a statement of a group waits for another session's
// row lock, on PostgreSQL (SQLite's busy timeout does that there), when Options leave
// it to the registry: past it the write fails alone, in its savepoint, rather than
// hold the turn, and every write behind it, for as long as its group's writes may wait.
const DefaultLockWait = 5 * time.Second

// errGroupAborted is the outcome of a write whose transaction ended before it was
// known to have committed (a panic in it): it was not written.
var errGroupAborted = errors.New("the write's transaction was abandoned before it committed")

// writeFunc runs the statements of one write through in, which puts them in the
// transaction, with ctx, and returns the history rows of what it changed.
type writeFunc func(ctx context.Context, in func(*sql.Stmt) *sql.Stmt) ([]entry, error)

// pendingWrite is a write waiting to be put in a transaction.
type pendingWrite struct {
	ctx  context.Context
	at   time.Time
	fn   writeFunc
	done chan error // buffered: receives the write's outcome once
}

// write runs the statements of one write (fn) and the history rows they report,
// stamped at, in a transaction that ends with the write fence's check while this
// registry holds a fence: rolled back with ErrFenced when another controller has taken
// the owner's fence since. It waits for its turn (but when read-only) and may share the
// transaction with other writes of this process. It gives up with ctx while it waits
// for the turn; once in a transaction it waits for that to end, which it does once
// committed or once every write in it has given up.
func (r *Registry) write(ctx context.Context, at time.Time, fn writeFunc) error {
	w := &pendingWrite{ctx: ctx, at: at, fn: fn, done: make(chan error, 1)}
	if r.writer == nil {
		r.commit(ctx, []*pendingWrite{w})
		return <-w.done
	}
	r.pendingMu.Lock()
	r.pending = append(r.pending, w)
	r.pendingMu.Unlock()
	for {
		select {
		case err := <-w.done: // written in another's group: no need to take the turn
			return err
		default:
		}
		select {
		case err := <-w.done:
			return err
		case r.writer <- struct{}{}:
			r.writePending()
		case <-ctx.Done():
			r.pendingMu.Lock()
			i := slices.Index(r.pending, w)
			if i >= 0 {
				r.pending = slices.Delete(r.pending, i, i+1)
			}
			r.pendingMu.Unlock()
			if i >= 0 {
				return fmt.Errorf("wait for this process's turn to write: %w", ctx.Err())
			}
			return <-w.done // another writer has taken it: it is being written
		}
	}
}

// writePending writes, holding the turn, up to maxGroup of the pending writes in one
// transaction, and then gives the turn up (also should the transaction panic).
func (r *Registry) writePending() {
	defer func() { <-r.writer }()
	r.pendingMu.Lock()
	n := min(len(r.pending), maxGroup)
	group := slices.Clone(r.pending[:n])
	r.pending = slices.Delete(r.pending, 0, n)
	r.pendingMu.Unlock()
	// Those given up since they were queued need no transaction.
	group = slices.DeleteFunc(group, func(w *pendingWrite) bool {
		if err := w.ctx.Err(); err != nil {
			w.done <- fmt.Errorf("wait for this process's turn to write: %w", err)
			return true
		}
		return false
	})
	if len(group) > 0 {
		ctx, cancel := groupContext(group)
		defer cancel()
		r.commit(ctx, group)
	}
}

// groupContext is the context of group's transaction. It is not tied to any one
// writer's context, whose end would interrupt the statement running and end the
// others' transaction; it ends once every writer of the group has given up, so that a
// server that stopped answering does not keep the turn, and every write behind it,
// for as long as the connection lives.
func groupContext(group []*pendingWrite) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(group[0].ctx))
	var live atomic.Int64
	live.Store(int64(len(group)))
	stops := make([]func() bool, 0, len(group))
	for _, w := range group {
		stops = append(stops, context.AfterFunc(w.ctx, func() {
			if live.Add(-1) == 0 {
				cancel()
			}
		}))
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}

// commit writes group in one transaction and tells each its outcome once the
// transaction has ended, so that what a failed write reads next to explain itself
// (notWritten) sees what the others wrote. A write whose own statements fail is rolled
// back alone (to its savepoint, when it shares the transaction) and gets its error;
// the others get the fence check's and the commit's.
func (r *Registry) commit(ctx context.Context, group []*pendingWrite) {
	// Until a write's outcome is known it is that of a transaction that did not end
	// (a panic in it): not written.
	outcome := make([]error, len(group))
	for i := range outcome {
		outcome[i] = errGroupAborted
	}
	var written []int // in group, of the writes in the transaction so far
	defer func() {
		for i, w := range group {
			w.done <- outcome[i]
		}
	}()
	// settle gives every write in the transaction err (nil once committed).
	settle := func(err error) {
		for _, i := range written {
			outcome[i] = err
		}
	}
	// abandon ends the transaction on err, for the writes in it and those not yet run.
	abandon := func(from int, err error) {
		settle(err)
		for i := from; i < len(group); i++ {
			outcome[i] = err
		}
	}
	r.transactions.Add(1)
	tx, err := r.db.BeginTx(ctx, nil)
	if err != nil {
		abandon(0, err)
		return
	}
	defer func() { _ = tx.Rollback() }()
	if err := limitLockWait(ctx, tx, r.dialect, r.lockWait); err != nil {
		abandon(0, err)
		return
	}
	in := func(s *sql.Stmt) *sql.Stmt { return tx.StmtContext(ctx, s) }
	shared := len(group) > 1
	for i, w := range group {
		if err := w.ctx.Err(); err != nil {
			outcome[i] = fmt.Errorf("wait for this process's turn to write: %w", err)
			continue
		}
		if !shared {
			if err := r.writeOne(ctx, in, w); err != nil {
				outcome[i] = err
				return // the deferred rollback undoes it
			}
			written = append(written, i)
			continue
		}
		if _, err := tx.ExecContext(ctx, "SAVEPOINT write"); err != nil {
			abandon(i, err)
			return
		}
		own := r.writeOne(ctx, in, w)
		if own == nil {
			if _, err := tx.ExecContext(ctx, "RELEASE write"); err != nil {
				abandon(i, err)
				return
			}
			written = append(written, i)
			continue
		}
		// Some errors (a full disk, an I/O error) end the whole transaction: then the
		// savepoint is gone, and so is every write in it.
		outcome[i] = own
		if err := rollbackTo(ctx, tx); err != nil {
			abandon(i+1, fmt.Errorf("the transaction it shared ended: %w", errors.Join(own, err)))
			return
		}
	}
	if len(written) == 0 {
		return
	}
	if token := r.fence.Load(); token != 0 {
		owner := *r.fenceOwner.Load()
		n, err := affected(in(r.fenceCheck).ExecContext(ctx, owner, token))
		if err != nil {
			settle(fmt.Errorf("check the write fence: %w", err))
			return
		}
		if n == 0 {
			settle(fmt.Errorf("write fence %d of owner %q: %w", token, owner, ErrFenced))
			return
		}
	}
	settle(tx.Commit()) // nil: every write in it landed
}

// writeOne runs one write's statements and its history rows in the transaction.
func (r *Registry) writeOne(ctx context.Context, in func(*sql.Stmt) *sql.Stmt, w *pendingWrite) error {
	entries, err := w.fn(ctx, in)
	if err != nil {
		return err
	}
	if !writeHistory {
		return nil // the bench's build without the history
	}
	for _, e := range entries {
		if e.cause == "" {
			e.cause = "unspecified"
		}
		if _, err := in(r.history).ExecContext(ctx, e.values(w.at, r.actor)...); err != nil {
			return fmt.Errorf("write the history row: %w", err)
		}
	}
	return nil
}

// rollbackTo undoes the statements of the write since its savepoint, and ends it.
func rollbackTo(ctx context.Context, tx *sql.Tx) error {
	if _, err := tx.ExecContext(ctx, "ROLLBACK TO write"); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, "RELEASE write")
	return err
}
