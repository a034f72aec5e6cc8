package main

import (
	"context"
	"errors"

	"github.com/student-controller/student-controller/internal/registry"
)

// errDryRun refuses every write of a dry run: Config.Leading returns it, so the guard (the
// controller's one write path) never reaches a client or the registry.
var errDryRun = errors.New("--dry-run: nothing is written")

// dryRunRegistry reads a read-only registry and refuses writes again, behind the guard.
type dryRunRegistry struct{ readOnlyRegistry }

func (dryRunRegistry) Apply(context.Context, registry.Op) (registry.Result, error) {
	return registry.Result{}, errDryRun
}
