package controller

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/student-controller/student-controller/internal/registry"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// sweepPlan is what one sweep would do: the diff of the registry against the cache.
type sweepPlan struct {
	// Resync are the Students whose row is missing or differs from them: their sync
	// repairs the row.
	Resync []string
	// Orphans are owned rows whose Student is gone.
	Orphans []registry.Record
}

// planSweep compares the rows this controller owns with the Students in the cache. It
// is a pure function of its inputs.
func planSweep(owner string, rows []registry.Record, students []*studentv1.Student) sweepPlan {
	byUID := make(map[types.UID]*studentv1.Student, len(students))
	for _, s := range students {
		byUID[s.UID] = s
	}
	var plan sweepPlan
	seen := make(map[types.UID]bool, len(rows))
	for _, row := range rows {
		if row.Owner != owner {
			continue // never another's
		}
		uid := types.UID(row.UID)
		seen[uid] = true
		s, ok := byUID[uid]
		if !ok {
			plan.Orphans = append(plan.Orphans, row)
			continue
		}
		if s.DeletionTimestamp == nil && !sameRow(row, recordOf(owner, s)) {
			plan.Resync = append(plan.Resync, cache.MetaObjectToName(s).String())
		}
	}
	for _, s := range students {
		if !seen[s.UID] && s.DeletionTimestamp == nil && ValidateSpec(s.Spec) == "" {
			plan.Resync = append(plan.Resync, cache.MetaObjectToName(s).String())
		}
	}
	return plan
}

// SweepResult is what one sweep found and did.
type SweepResult struct {
	Rows    int // owned rows compared
	Resync  int // Students queued to repair their rows
	Orphans int // owned rows without a Student
	Deleted int // orphan rows deleted
	// Live are orphans by the cache whose Student the API server still has: the cache
	// was behind (a watch cut, a new leader's first minutes), and the row stays.
	Live int
	// Malformed are owned rows that cannot be read, skipped: their Students' syncs
	// rewrite them, and rows of no Student are left to whoever wrote them.
	Malformed int
	// Refused is set when the orphans were more than the safety bound allows, and
	// none was deleted.
	Refused bool
}

// Sweep compares every row this controller owns with the Students in the cache: rows
// that are missing or differ are repaired by queueing their Student, and owned rows
// whose Student is gone are deleted, unless there are more of them than
// SweepMaxDeletions. Run only calls it once the cache has synced.
func (c *Controller) Sweep(ctx context.Context) (SweepResult, error) {
	logger := klog.FromContext(ctx)
	// Rows first, cache second: a Student deleted in between has had its row deleted by
	// its finalizer, so a stale row read here at worst costs a delete that finds nothing.
	rows, malformed, err := c.registry.List(ctx, c.cfg.Owner)
	if err != nil {
		return SweepResult{}, fmt.Errorf("sweep: %w", err)
	}
	c.reportMalformed(logger, malformed)
	students, err := c.lister.List(labels.Everything())
	if err != nil {
		return SweepResult{}, fmt.Errorf("sweep: %w", err)
	}
	plan := planSweep(c.cfg.Owner, rows, students)
	result := SweepResult{Rows: len(rows), Resync: len(plan.Resync), Orphans: len(plan.Orphans), Malformed: len(malformed)}
	for _, key := range plan.Resync {
		c.queue.Add(key)
	}

	if err := c.mayWrite(); err != nil {
		// The next leader's sweep does it, or this one's once it has renewed.
		return result, fmt.Errorf("sweep: %w", err)
	}
	if len(plan.Orphans) > c.cfg.SweepMaxDeletions {
		result.Refused = true
		msg := fmt.Sprintf("Sweep refused to delete %d orphan registry rows: more than the bound of %d (--sweep-max-deletions). "+
			"Check that the controller watches the right cluster; raise the bound to let the deletion happen",
			len(plan.Orphans), c.cfg.SweepMaxDeletions)
		logger.Error(nil, msg, "orphans", len(plan.Orphans), "bound", c.cfg.SweepMaxDeletions, "students", len(students))
		if c.cfg.SweepEventTarget != nil {
			c.recorder.Event(c.cfg.SweepEventTarget, corev1.EventTypeWarning, EventSweepRefused, msg)
		}
		return result, nil
	}

	var errs []error
	for _, row := range plan.Orphans {
		if err := c.mayWrite(); err != nil {
			errs = append(errs, err)
			break
		}
		// The cache may be behind the API server; a row is deleted only when the API
		// server, asked now, has no Student of its UID.
		live, err := c.studentExists(ctx, row)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if live {
			result.Live++
			continue
		}
		deleted, err := c.registry.Delete(ctx, row.UID, c.cfg.Owner)
		if err != nil && !errors.Is(err, registry.ErrNotOwned) {
			errs = append(errs, err)
			continue
		}
		if deleted {
			result.Deleted++
			logger.V(2).Info("Sweep deleted an orphan registry row", "uid", row.UID, "student", klog.KRef(row.Namespace, row.Name))
		}
	}
	if result.Resync > 0 || result.Orphans > 0 || len(errs) > 0 {
		logger.Info("Sweep found rows to repair or delete", "rows", result.Rows, "resync", result.Resync, "orphans", result.Orphans,
			"deleted", result.Deleted, "studentStillThere", result.Live)
	} else {
		logger.V(4).Info("Sweep found no drift", "rows", result.Rows)
	}
	if len(errs) > 0 {
		return result, fmt.Errorf("sweep: %w", errors.Join(errs...))
	}
	return result, nil
}

// studentExists asks the API server whether the Student of a row exists: by the
// namespace and name the row records, with the row's UID.
func (c *Controller) studentExists(ctx context.Context, row registry.Record) (bool, error) {
	s, err := c.client.BolingcavalryV1().Students(row.Namespace).Get(ctx, row.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("sweep: confirm that Student %s/%s is gone: %w", row.Namespace, row.Name, err)
	}
	return string(s.UID) == row.UID, nil
}

// reportMalformed logs each unreadable row once, when a sweep first finds it.
func (c *Controller) reportMalformed(logger klog.Logger, rows []registry.MalformedRow) {
	seen := make(map[string]bool, len(rows))
	for _, row := range rows {
		seen[row.UID] = true
		if !c.malformed[row.UID] {
			logger.Error(nil, "Registry row cannot be read; the sweep skips it", "uid", row.UID, "problem", row.Problem)
		}
	}
	c.malformed = seen
}
