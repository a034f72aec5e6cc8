package main

import (
	"context"
	"errors"

	"github.com/student-controller/student-controller/internal/registry"
)

// errDryRun is what Config.Leading returns in a dry run, so the guard (the one write path)
// reaches no client or registry.
var errDryRun = errors.New("--dry-run: nothing is written")

// dryRunRegistry reads a read-only registry and refuses writes again, behind the guard.
type dryRunRegistry struct{ readOnlyRegistry }

func (dryRunRegistry) Apply(context.Context, registry.Op) (registry.Result, error) {
	return registry.Result{}, errDryRun
}
