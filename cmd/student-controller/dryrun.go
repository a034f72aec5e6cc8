package main

import (
	"context"
	"errors"

	"github.com/student-controller/student-controller/internal/registry"
)

// errDryRun refuses every write of a dry run: Config.Leading answers it, so the
// controller's one write path (its guard) never reaches a client or the registry.
var errDryRun = errors.New("--dry-run: nothing is written")

// dryRunRegistry is the registry of a dry run: it reads a read-only registry, and its
// writes, which the guard never lets through, are refused again here.
type dryRunRegistry struct{ readOnlyRegistry }

func (dryRunRegistry) Apply(context.Context, registry.Op) (registry.Result, error) {
	return registry.Result{}, errDryRun
}
