package registry

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Binding ties an owner to the cluster whose Students its rows mirror.
type Binding struct {
	Owner   string
	Cluster string
	BoundAt time.Time
}

// Bind binds owner to cluster on first use, and returns the binding as stored. When
// owner is already bound to another cluster it returns that binding and an error that
// wraps ErrOtherCluster: the caller must write nothing.
func (r *Registry) Bind(ctx context.Context, owner, cluster string) (Binding, error) {
	if owner == "" || cluster == "" {
		return Binding{}, fmt.Errorf("bind owner: owner and cluster are required (owner %q, cluster %q)", owner, cluster)
	}
	err := r.fencedTx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO owner_clusters (owner, cluster, bound_at) VALUES ($1, $2, $3)
			ON CONFLICT (owner) DO NOTHING`, owner, cluster, r.now().UTC())
		return err
	})
	if err != nil {
		return Binding{}, fmt.Errorf("bind owner %q to cluster %s: %w", owner, cluster, err)
	}
	b, err := r.binding(ctx, owner)
	if err != nil {
		return Binding{}, err
	}
	if b.Cluster != cluster {
		return b, fmt.Errorf("owner %q is bound to cluster %s since %s, and this controller watches cluster %s: %w",
			owner, b.Cluster, b.BoundAt.Format(time.RFC3339), cluster, ErrOtherCluster)
	}
	return b, nil
}

// BindingOf returns the cluster owner is bound to: ErrNotFound when it is bound to
// none yet. It only reads.
func (r *Registry) BindingOf(ctx context.Context, owner string) (Binding, error) {
	return r.binding(ctx, owner)
}

func (r *Registry) binding(ctx context.Context, owner string) (Binding, error) {
	b := Binding{Owner: owner}
	err := r.db.QueryRowContext(ctx, `SELECT cluster, bound_at FROM owner_clusters WHERE owner = $1`, owner).Scan(&b.Cluster, &b.BoundAt)
	if errors.Is(err, sql.ErrNoRows) {
		return Binding{}, fmt.Errorf("owner %q: %w", owner, ErrNotFound)
	}
	if err != nil {
		return Binding{}, fmt.Errorf("read the cluster of owner %q: %w", owner, err)
	}
	b.BoundAt = b.BoundAt.UTC()
	return b, nil
}

// MoveCluster binds owner to cluster to, where it was bound to from: the explicit
// step that lets a controller of another cluster take over an owner's rows (a cluster
// rebuilt, a registry moved). It refuses when owner is bound to anything but from,
// so that it never moves a binding its caller did not see.
func (r *Registry) MoveCluster(ctx context.Context, owner, from, to string) (Binding, error) {
	if owner == "" || from == "" || to == "" {
		return Binding{}, errors.New("move owner: owner, from and to are required")
	}
	tx, err := r.db.BeginTx(ctx, nil)
	if err != nil {
		return Binding{}, fmt.Errorf("move owner %q to cluster %s: %w", owner, to, err)
	}
	defer func() { _ = tx.Rollback() }()
	n, err := affected(tx.ExecContext(ctx, `UPDATE owner_clusters SET cluster = $3, bound_at = $4 WHERE owner = $1 AND cluster = $2`,
		owner, from, to, r.now().UTC()))
	if err == nil && n > 0 {
		if err = r.checkFenceIn(ctx, tx); err == nil {
			err = tx.Commit()
		}
	}
	if err != nil {
		return Binding{}, fmt.Errorf("move owner %q to cluster %s: %w", owner, to, err)
	}
	if n == 0 {
		b, err := r.binding(ctx, owner)
		if err != nil {
			return Binding{}, err
		}
		return b, fmt.Errorf("owner %q is bound to cluster %s, not %s: nothing moved", owner, b.Cluster, from)
	}
	return r.binding(ctx, owner)
}

// RenameOwner gives every row of owner from, its cluster binding and its write fence,
// to owner to, in one transaction with a history row for each row adopted, and
// returns how many rows moved. It refuses when to already owns
// rows, a binding or a fence, so that two owners' rows never merge by mistake. Stop the
// controllers of both owners first.
func (r *Registry) RenameOwner(ctx context.Context, from, to string) (int64, error) {
	if from == "" || to == "" || from == to {
		return 0, fmt.Errorf("rename owner: want two different, non-empty owners (from %q, to %q)", from, to)
	}
	tx, err := r.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("rename owner: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	var taken int
	if err := tx.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM students WHERE owner = $1) + (SELECT count(*) FROM owner_clusters WHERE owner = $1) + (SELECT count(*) FROM fences WHERE owner = $1)`,
		to).Scan(&taken); err != nil {
		return 0, fmt.Errorf("rename owner: %w", err)
	}
	if taken > 0 {
		return 0, fmt.Errorf("rename owner %q to %q: %q already owns rows or a cluster binding; nothing moved", from, to, to)
	}
	// The fence is the caller's (student-controller registry rename-owner holds it):
	// checked first, then handed to the new owner free, so that its controller takes it
	// at once and this caller writes nothing more for either owner.
	if err := r.checkFenceIn(ctx, tx); err != nil {
		return 0, fmt.Errorf("rename owner: %w", err)
	}
	res, err := tx.ExecContext(ctx, `UPDATE students SET owner = $2 WHERE owner = $1`, from, to)
	if err != nil {
		return 0, fmt.Errorf("rename owner: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, err
	}
	// The new owner adopts each row: one history row each (none in the bench's build
	// without the history).
	if writeHistory {
		if _, err := tx.ExecContext(ctx, `INSERT INTO student_history
			(at, uid, namespace, name, student_name, school, generation, action, owner, cause, actor, deletion_policy)
			SELECT $1, CAST(uid AS TEXT), namespace, name, student_name, school, generation, $2, owner, $3, $4,
				CASE WHEN deletion_policy IN ('Delete', 'Orphan') THEN deletion_policy END
			FROM students WHERE owner = $5 AND CAST(uid AS TEXT) <> ''`,
			r.now().UTC(), ActionAdopted, CauseOwnerMove, r.actor, to); err != nil {
			return 0, fmt.Errorf("rename owner: write the history: %w", err)
		}
	}
	if _, err := tx.ExecContext(ctx, `UPDATE students SET released_by = $2 WHERE released_by = $1`, from, to); err != nil {
		return 0, fmt.Errorf("rename owner: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE owner_clusters SET owner = $2 WHERE owner = $1`, from, to); err != nil {
		return 0, fmt.Errorf("rename owner: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE fences SET owner = $2, token = 0, holder = NULL, expires_at = NULL WHERE owner = $1`, from, to); err != nil {
		return 0, fmt.Errorf("rename owner: %w", err)
	}
	return n, tx.Commit()
}
