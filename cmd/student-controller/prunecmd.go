package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/student-controller/student-controller/internal/controller"
	"github.com/student-controller/student-controller/internal/mark"
	"github.com/student-controller/student-controller/internal/registry"
)

// pruneOptions are prune's own flags.
type pruneOptions struct {
	max int
	yes bool
}

// pruneRows runs "student-controller registry prune", the one explicit delete of rows
// released for absence: rows released without their Students under the Delete policy,
// whose Students are still gone. With --yes it deletes them under the owner's write fence.
// Exit code: 2 when rows would be pruned (no --yes) or --max-prunes refused them, else 0.
func pruneRows(ctx context.Context, opts options, po pruneOptions, migrate bool, stdout io.Writer) (int, error) {
	c, err := commandClients(ctx, opts)
	if err != nil {
		return 1, err
	}
	reg, release, err := openRegistry(ctx, opts, po.yes, migrate)
	if err != nil {
		return 1, err
	}
	defer func() { release(); _ = reg.Close() }()
	if err := reg.CheckBinding(ctx, opts.owner, c.id); err != nil {
		return 1, err
	}
	// A registry put back in time may record stale policies: prune nothing until confirmed.
	if err := mark.Behind(ctx, c.kube, markPlace(opts), opts.owner, reg, true); err != nil {
		return 1, fmt.Errorf("refused: %w", err)
	}
	released, malformed, err := reg.ListReleased(ctx, opts.owner)
	if err != nil {
		return 1, err
	}
	var prune, live []registry.Record
	for _, r := range released {
		if !registry.Prunable(r, opts.owner) || !opts.scope.Contains(r.Namespace) {
			continue
		}
		if there, err := c.studentThere(ctx, r); err != nil {
			return 1, err
		} else if there {
			live = append(live, r)
		} else {
			prune = append(prune, r)
		}
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ACTION\tNAMESPACE\tNAME\tUID\tRELEASED\tCAUSE")
	for _, r := range prune {
		fmt.Fprintf(w, "prune\t%s\t%s\t%s\t%s\t%s\n", r.Namespace, r.Name, r.UID, r.ReleasedAt.Format("2006-01-02T15:04:05Z"), r.ReleaseCause)
	}
	for _, r := range live {
		fmt.Fprintf(w, "keep\t%s\t%s\t%s\t%s\t%s\n", r.Namespace, r.Name, r.UID, r.ReleasedAt.Format("2006-01-02T15:04:05Z"),
			"its Student is there: its controller takes the row back")
	}
	if err := w.Flush(); err != nil {
		return 1, err
	}
	fmt.Fprintf(stdout, "registry %s, owner %q: %d released rows of policy Delete without a Student, %d kept (Student there), %d unreadable\n",
		reg, opts.owner, len(prune), len(live), len(malformed))
	switch {
	case len(prune) == 0:
		return 0, nil
	case len(prune) > po.max:
		fmt.Fprintf(stdout, "Refused: %d rows to prune, more than --max-prunes (%d); nothing was deleted\n", len(prune), po.max)
		return 2, nil
	case !po.yes:
		fmt.Fprintln(stdout, "Nothing was deleted. Check the list, back up the registry, then run again with --yes")
		return 2, nil
	}
	done := 0
	for _, r := range prune {
		if ok, err := reg.Prune(ctx, r.UID, opts.owner); err != nil {
			return 1, fmt.Errorf("%d of %d pruned; %s/%s (row %s): %w", done, len(prune), r.Namespace, r.Name, r.UID, err)
		} else if ok {
			done++
		}
	}
	fmt.Fprintf(stdout, "pruned %d of %d rows (history: deleted, cause %s)\n", done, len(prune), registry.CausePrune)
	return 0, nil
}

// studentThere asks the API server whether row's Student (namespace, name, uid) exists.
func (c clusterClients) studentThere(ctx context.Context, row registry.Record) (bool, error) {
	s, err := c.students.BolingcavalryV1().Students(row.Namespace).Get(ctx, row.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("ask whether Student %s/%s is there: %w", row.Namespace, row.Name, err)
	}
	return controller.HasRow(s, row), nil
}
