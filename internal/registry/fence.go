package registry

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"time"
)

// DefaultLeaseDuration is how long a write fence stays its holder's without a renewal
// when Options leave it to the registry.
const DefaultLeaseDuration = 15 * time.Second

// HeldError is TakeFence's answer while another controller holds the owner's fence.
type HeldError struct {
	Owner, Holder string
	// For is how long the holder's lease still runs unless renewed.
	For time.Duration
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("the write fence of owner %q is held by %s for %v more unless renewed: another controller of this owner is live",
		e.Owner, e.Holder, e.For.Round(time.Millisecond))
}

// Is makes a HeldError an ErrHeld.
func (e *HeldError) Is(target error) bool { return target == ErrHeld }

// leaseSchema is the schema version from which the fence is a lease (0006).
const leaseSchema = 6

// FenceIsLease reports whether the registry's schema makes the fence a lease (version
// 6 or newer), so that TakeFence can wait for a live holder before anything else is
// written, the schema's migration included. An older schema's fence has no holder: a
// controller migrates it first.
func (r *Registry) FenceIsLease(ctx context.Context) (bool, error) {
	if r.schemaReadFault != nil {
		if err := r.schemaReadFault(); err != nil {
			return false, fmt.Errorf("registry %s: %w", r.display, err)
		}
	}
	v, err := schemaVersion(ctx, r.db, r.dialect)
	if err != nil {
		return false, fmt.Errorf("registry %s: %w", r.display, err)
	}
	return v >= leaseSchema, nil
}

// Holder names this registry in the fences it takes: Options.Actor and a suffix drawn
// when it was opened.
func (r *Registry) Holder() string { return r.holder }

// TakeFence takes owner's write fence for this registry, when no other controller holds
// it: it sets the owner's token to a new random one, names this registry its holder,
// and leases it for Options.LeaseDuration, in the registry's clock. From then on every
// write of this registry commits only while the owner's token is still its own.
//
// While another holder's lease runs, TakeFence changes nothing and returns a *HeldError
// naming it: a clone of the cluster, a second Deployment or a laptop with the same
// owner waits instead of writing. A holder that stops gracefully gives the fence back
// (ReleaseFence); one that crashed or lost the registry for longer than the lease is
// taken over, and its late writes (a paused leader's, one that waited on a lock) are
// rolled back with ErrFenced. Random rather than counted, a token never comes back:
// not after its row was deleted, nor after an owner renamed away and back.
func (r *Registry) TakeFence(ctx context.Context, owner string) (int64, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return 0, err
	}
	token := int64(binary.BigEndian.Uint64(b[:])>>1) | 1 // positive: 0 means none
	fail := func(err error) (int64, error) {
		return 0, fmt.Errorf("take the write fence of owner %q: %w", owner, err)
	}
	done, err := r.turn(ctx)
	if err != nil {
		return fail(err)
	}
	defer done()
	// A controller that waits asks first, with a read that locks nothing: the insert
	// below locks the fence's row on PostgreSQL even when its WHERE is false, and a
	// waiter paused inside its transaction would then hold up every fenced write of
	// the holder. The write comes only once the lease has lapsed.
	if held, err := r.fenceHeld(ctx, owner); err != nil {
		return fail(err)
	} else if held != nil {
		return 0, held
	}
	tx, err := r.db.BeginTx(ctx, nil)
	if err != nil {
		return fail(err)
	}
	defer func() { _ = tx.Rollback() }()
	// A former holder paused inside a write holds the fence row's lock: wait for it
	// less than a lease, then fail and let the caller retry (the server ends such a
	// transaction: idle_in_transaction_session_timeout).
	if err := limitLockWait(ctx, tx, r.dialect, min(10*time.Second, r.lease/2)); err != nil {
		return fail(err)
	}
	taken, err := affected(tx.ExecContext(ctx, `INSERT INTO fences (owner, token, holder, expires_at) VALUES ($1, $2, $4, `+r.dialect.inMillis+`)
		ON CONFLICT (owner) DO UPDATE SET token = excluded.token, holder = excluded.holder, expires_at = excluded.expires_at
		WHERE fences.holder IS NULL OR fences.expires_at IS NULL OR fences.expires_at <= `+r.dialect.clock+` OR fences.holder = excluded.holder`,
		owner, token, r.lease.Milliseconds(), r.holder))
	if err != nil {
		return fail(err)
	}
	if r.fenceStall != nil {
		r.fenceStall()
	}
	if taken == 0 {
		// Taken by another between the read and the write.
		if err := tx.Rollback(); err != nil {
			return fail(err)
		}
		held, err := r.fenceHeld(ctx, owner)
		if err != nil {
			return fail(err)
		}
		if held == nil {
			held = &HeldError{Owner: owner, Holder: "another controller"}
		}
		return 0, held
	}
	if err := tx.Commit(); err != nil {
		return fail(err)
	}
	r.fenceOwner.Store(&owner)
	r.fence.Store(token)
	return token, nil
}

// fencedTx runs write in a transaction that checks the fence first (checkFenceIn),
// and commits it.
func (r *Registry) fencedTx(ctx context.Context, write func(*sql.Tx) error) error {
	tx, err := r.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if err := r.checkFenceIn(ctx, tx); err != nil {
		return err
	}
	if err := write(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// checkFenceIn checks, inside tx, that the fence this registry holds is still its
// own, and locks its row until tx ends: ErrFenced when another took it. Nothing to
// check when this registry holds none (a registry of a schema before the lease, or a
// caller that does not fence).
func (r *Registry) checkFenceIn(ctx context.Context, tx *sql.Tx) error {
	token := r.fence.Load()
	if token == 0 {
		return nil
	}
	owner := *r.fenceOwner.Load()
	n, err := affected(tx.ExecContext(ctx, fenceCheckSQL, owner, token))
	switch {
	case err != nil:
		return fmt.Errorf("check the write fence: %w", err)
	case n == 0:
		return fmt.Errorf("write fence %d of owner %q: %w", token, owner, ErrFenced)
	}
	return nil
}

// fenceHeld reads owner's fence, locking nothing: a *HeldError while another holder's
// lease runs, nil when the fence is free, lapsed or this registry's.
func (r *Registry) fenceHeld(ctx context.Context, owner string) (*HeldError, error) {
	var holder sql.NullString
	var ms sql.NullInt64
	err := r.db.QueryRowContext(ctx, fmt.Sprintf(`SELECT holder, %s FROM fences WHERE owner = $1`,
		fmt.Sprintf(r.dialect.untilMillis, "expires_at")), owner).Scan(&holder, &ms)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil, nil
	case err != nil:
		return nil, err
	case !holder.Valid || !ms.Valid || ms.Int64 <= 0 || holder.String == r.holder:
		return nil, nil
	}
	return &HeldError{Owner: owner, Holder: holder.String, For: time.Duration(ms.Int64) * time.Millisecond}, nil
}

// RenewFence extends the lease of the fence this registry holds by Options.LeaseDuration
// from now, in the registry's clock. ErrFenced when another controller took the fence
// (this one's lease ran out first) or it was given back; nothing to do when this
// registry took none.
func (r *Registry) RenewFence(ctx context.Context) error {
	return r.updateFence(ctx, "renew", `UPDATE fences SET expires_at = `+r.dialect.inMillis+` WHERE owner = $1 AND token = $2`,
		r.lease.Milliseconds())
}

// ReleaseFence gives back the fence this registry holds, so that the next controller
// takes it at once: the owner's token becomes 0, which no holder has, so a write of
// this registry that still comes is rolled back. Call it once the writes have drained.
// Nothing to do when this registry holds none, or no longer.
func (r *Registry) ReleaseFence(ctx context.Context) error {
	err := r.updateFence(ctx, "give back", `UPDATE fences SET token = 0, holder = NULL, expires_at = NULL WHERE owner = $1 AND token = $2`)
	if errors.Is(err, ErrFenced) {
		return nil
	}
	return err
}

// updateFence runs query on the fence this registry holds ($1 its owner, $2 its token,
// then args), in its turn at the write lock: ErrFenced when the fence is no longer its
// own, nothing when it took none.
func (r *Registry) updateFence(ctx context.Context, what, query string, args ...any) error {
	token := r.fence.Load()
	if token == 0 {
		return nil
	}
	owner := *r.fenceOwner.Load()
	done, err := r.turn(ctx)
	if err != nil {
		return fmt.Errorf("%s the write fence of owner %q: %w", what, owner, err)
	}
	defer done()
	n, err := affected(r.db.ExecContext(ctx, query, append([]any{owner, token}, args...)...))
	switch {
	case err != nil:
		return fmt.Errorf("%s the write fence of owner %q: %w", what, owner, err)
	case n == 0:
		return fmt.Errorf("%s the write fence %d of owner %q: %w", what, token, owner, ErrFenced)
	}
	return nil
}

// LeaseDuration is how long the fence stays this registry's without a renewal.
func (r *Registry) LeaseDuration() time.Duration { return r.lease }

// randomSuffix is 8 random hex digits, or "unknown" in the unlikely case that the
// system has no randomness to give.
func randomSuffix() string {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "unknown"
	}
	return hex.EncodeToString(b[:])
}

// AdvanceMark raises the owner's mark by one, under the fence this registry holds, and
// returns it: the registry's own clock, which only a holder moves forward and only a
// registry put back in time moves back. The controller calls it every third of the
// lease and keeps the highest it has seen outside the registry (in the cluster), so
// that a registry found below it is known to be older than what the cluster has seen.
// ErrFenced when the fence is no longer this registry's; an error when it holds none.
func (r *Registry) AdvanceMark(ctx context.Context) (int64, error) {
	token := r.fence.Load()
	if token == 0 {
		return 0, errors.New("advance the registry's mark: this registry holds no write fence")
	}
	owner := *r.fenceOwner.Load()
	done, err := r.turn(ctx)
	if err != nil {
		return 0, fmt.Errorf("advance the registry's mark of owner %q: %w", owner, err)
	}
	defer done()
	var mark int64
	err = r.db.QueryRowContext(ctx, `UPDATE fences SET mark = mark + 1 WHERE owner = $1 AND token = $2 RETURNING mark`,
		owner, token).Scan(&mark)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return 0, fmt.Errorf("advance the registry's mark: write fence %d of owner %q: %w", token, owner, ErrFenced)
	case err != nil:
		return 0, fmt.Errorf("advance the registry's mark of owner %q: %w", owner, err)
	}
	return mark, nil
}

// ReadMark is owner's mark as the registry has it now (AdvanceMark); 0 when the owner
// has no fence yet.
func (r *Registry) ReadMark(ctx context.Context, owner string) (int64, error) {
	var mark int64
	err := r.db.QueryRowContext(ctx, `SELECT mark FROM fences WHERE owner = $1`, owner).Scan(&mark)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("read the registry's mark of owner %q: %w", owner, err)
	}
	return mark, nil
}
