package main

import (
	"context"
	"errors"
	"time"

	"github.com/student-controller/student-controller/internal/registry"
)

// errDryRun refuses every write of a dry run: Config.Leading answers it, so the
// controller's one write path (its guard) never reaches a client or the registry.
var errDryRun = errors.New("--dry-run: nothing is written")

// dryRunRegistry is the registry of a dry run: it reads a read-only registry, and its
// writes, which the guard never lets through, are refused again here.
type dryRunRegistry struct{ readOnlyRegistry }

func (dryRunRegistry) Insert(context.Context, registry.Record, string) (registry.Record, error) {
	return registry.Record{}, errDryRun
}

func (dryRunRegistry) Upsert(context.Context, registry.Record, registry.Why) (registry.Record, error) {
	return registry.Record{}, errDryRun
}

func (dryRunRegistry) Rewind(context.Context, registry.Record, int64) (registry.Record, error) {
	return registry.Record{}, errDryRun
}

func (dryRunRegistry) Delete(context.Context, string, string, string) (registry.Outcome, error) {
	return registry.Absent, errDryRun
}

func (dryRunRegistry) TakeBack(context.Context, registry.Record, string) (registry.Record, error) {
	return registry.Record{}, errDryRun
}

func (dryRunRegistry) Release(context.Context, registry.Record, string) (bool, error) {
	return false, errDryRun
}

func (dryRunRegistry) Relinquish(context.Context, string, string, string) (registry.Outcome, error) {
	return registry.Absent, errDryRun
}

func (dryRunRegistry) RecordPolicy(context.Context, string, string, string) error { return errDryRun }

func (dryRunRegistry) MarkObserved(context.Context, string, string) error { return errDryRun }

func (dryRunRegistry) Adopt(context.Context, string, registry.Record, string) error { return errDryRun }

func (dryRunRegistry) Bind(context.Context, string, string) (registry.Binding, error) {
	return registry.Binding{}, errDryRun
}

func (dryRunRegistry) PruneHistory(context.Context, time.Time) (int64, error) { return 0, errDryRun }
