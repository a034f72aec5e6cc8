package registry

import (
	"context"
	"fmt"
	"time"
)

// OpKind names a write Apply makes.
type OpKind int

const (
	OpInsert OpKind = iota + 1
	OpUpsert
	OpRewind
	OpTakeBack
	OpDelete
	OpRelease
	OpRelinquish
	OpRecordPolicy
	OpMarkObserved
	OpAdopt
	// OpBind checks that the program may write: the schema is not newer than it, and
	// the owner is bound to Op.Cluster (bound on first use; not asked when empty).
	OpBind
	OpPruneHistory
)

// opNames name the kinds in metrics and traces.
var opNames = map[OpKind]string{
	OpInsert: "insert", OpUpsert: "upsert", OpRewind: "rewind", OpTakeBack: "take_back", OpDelete: "delete",
	OpRelease: "release", OpRelinquish: "relinquish", OpRecordPolicy: "record_policy", OpMarkObserved: "mark_observed",
	OpAdopt: "adopt", OpBind: "bind", OpPruneHistory: "prune_history",
}

func (k OpKind) String() string { return opNames[k] }

// Op is one write to the registry, with what its method takes.
type Op struct {
	Kind OpKind
	// Record is the row written (Insert, Upsert, Rewind, TakeBack, Release; Adopt:
	// its Student and owner), or names it (UID and Owner: Delete, Relinquish,
	// MarkObserved; RecordPolicy with its DeletionPolicy; Bind: Owner alone).
	Record Record
	// Why is the history row's action and cause (its Cause alone where the kind says
	// the action).
	Why Why
	// Ahead is the generation a rewound row holds; Row the uid of the row Adopt binds.
	Ahead int64
	Row   string
	// Cluster is what Bind binds the owner to; Before is PruneHistory's cutoff.
	Cluster string
	Before  time.Time
}

// Result is what an Op's write returned.
type Result struct {
	// Record is the row as written (Insert, Upsert, Rewind, TakeBack).
	Record Record
	// Outcome is what became of the row (Delete, Relinquish; Release: Released or
	// Absent).
	Outcome Outcome
	Binding Binding
	// Pruned counts the history rows PruneHistory deleted.
	Pruned int64
}

// Apply makes op's write by its method, with the same preconditions and errors.
func (r *Registry) Apply(ctx context.Context, op Op) (Result, error) {
	var out Result
	var err error
	rec := op.Record
	switch op.Kind {
	case OpInsert:
		out.Record, err = r.Insert(ctx, rec, op.Why.Cause)
	case OpUpsert:
		out.Record, err = r.Upsert(ctx, rec, op.Why)
	case OpRewind:
		out.Record, err = r.Rewind(ctx, rec, op.Ahead)
	case OpTakeBack:
		out.Record, err = r.TakeBack(ctx, rec, op.Why.Cause)
	case OpDelete:
		out.Outcome, err = r.Delete(ctx, rec.UID, rec.Owner, op.Why.Cause)
	case OpRelease:
		var released bool
		if released, err = r.Release(ctx, rec, op.Why.Cause); released {
			out.Outcome = Released
		}
	case OpRelinquish:
		out.Outcome, err = r.Relinquish(ctx, rec.UID, rec.Owner, op.Why.Cause)
	case OpRecordPolicy:
		err = r.RecordPolicy(ctx, rec.UID, rec.Owner, rec.DeletionPolicy)
	case OpMarkObserved:
		err = r.MarkObserved(ctx, rec.UID, rec.Owner)
	case OpAdopt:
		err = r.Adopt(ctx, op.Row, rec, op.Why.Cause)
	case OpBind:
		if err = r.CheckSchema(ctx); err == nil && op.Cluster != "" {
			out.Binding, err = r.Bind(ctx, rec.Owner, op.Cluster)
		}
	case OpPruneHistory:
		out.Pruned, err = r.PruneHistory(ctx, op.Before)
	default:
		err = fmt.Errorf("no registry write of kind %d", op.Kind)
	}
	return out, err
}
