package chaos

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	clientretry "k8s.io/client-go/util/retry"

	"github.com/student-controller/student-controller/internal/testenv/controlplane"
	"github.com/student-controller/student-controller/internal/testenv/pgtest"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
	"github.com/student-controller/student-controller/pkg/generated/clientset/versioned"
)

// database is the run's own connection to the registry, which the checker and the
// generation watcher read through. Putting a SQLite backup back replaces the file, so
// the connection is opened again.
type database struct {
	p    atomic.Pointer[sql.DB]
	open func() (*sql.DB, error)
}

func (d *database) get() *sql.DB { return d.p.Load() }

// reopen closes the connection, runs between (the file is replaced), and opens it again.
func (d *database) reopen(between func() error) error {
	if err := d.get().Close(); err != nil {
		return err
	}
	err := between()
	db, openErr := d.open()
	if openErr == nil {
		d.p.Store(db)
	}
	return errors.Join(err, openErr)
}

// restoredRows is what a backup put back left of the rows of Students deleted after
// it was taken.
type restoredRows struct {
	// ownedWithoutStudent: rows the backup holds owned whose Students were gone (no
	// finalizer left to run) when the controller came back; the sweep must release
	// them, whatever their policy, once an operator confirms the registry.
	ownedWithoutStudent map[string]bool
	// lost: deleted Orphan Students whose released rows the backup does not hold
	// (written after it was taken); the restore lost them, not the controller.
	lost map[string]bool
}

// The registry's mark as the cluster keeps it: the ConfigMap the controllers name
// after their Lease, in its namespace.
const (
	markConfigMap      = leaseName + "-registry-mark"
	annotationConfirms = "bolingcavalry.k8s.io/registry-behind-confirmed"
)

// backup is the phase's backup of the registry, taken as the phase starts: its file,
// and the registry's mark when it was taken (at most).
type backup struct {
	path string
	mark int64
}

// takeBackup backs the registry up as an operator does: `registry backup` on SQLite
// (one snapshot, while the controller writes), pg_dump on PostgreSQL.
func (w *world) takeBackup(ctx context.Context) (*backup, error) {
	b := &backup{path: filepath.Join(w.dir, "registry.backup")}
	var cmd *exec.Cmd
	if w.pg == nil {
		cmd = exec.CommandContext(ctx, w.bin, "registry", "backup", "--registry", w.registryURL, "--to", b.path) // #nosec G204 -- the run's own binary and paths
	} else {
		cmd = exec.CommandContext(ctx, filepath.Join(pgtest.BinDir(), "pg_dump"), "--format=custom", "--file="+b.path, "--dbname="+w.pg.URL("registry", true)) // #nosec G204 -- PostgreSQL's own tool
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("back the registry up: %v\n%s", err, out)
	}
	// Read after the backup, the mark is at least the backup's.
	if err := w.db.get().QueryRowContext(ctx, `SELECT mark FROM fences WHERE owner = $1`, owner).Scan(&b.mark); err != nil {
		return nil, fmt.Errorf("read the registry's mark: %w", err)
	}
	return b, nil
}

// waitMarkPast waits until the cluster keeps a mark of the registry past the
// backup's: a registry put back to the backup is then behind it.
func (w *world) waitMarkPast(ctx context.Context, b *backup) error {
	cms := kubernetes.NewForConfigOrDie(w.cluster.admin).CoreV1().ConfigMaps(controlplane.ControllerNamespace)
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		cm, err := cms.Get(ctx, markConfigMap, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		mark, _ := strconv.ParseInt(cm.Data["mark"], 10, 64)
		return mark > b.mark, nil
	})
	if err != nil {
		return fmt.Errorf("the cluster's mark did not pass the backup's (%d): %w", b.mark, err)
	}
	return nil
}

// restoreBackup strikes faultRegistryRestored: the controller is scaled to zero, the
// backup taken before the bulk began is put back while the bulk goes on, and once the
// bulk has all arrived the controller comes back. It must find the registry behind
// the cluster's mark: live Students' rows written back, nothing released until an
// operator confirms, then the rows of Students deleted since the backup released,
// never deleted.
func (w *world) restoreBackup(ctx context.Context, b *backup, ph *phaseResult) (healed time.Time, err error) {
	cms := kubernetes.NewForConfigOrDie(w.cluster.admin).CoreV1().ConfigMaps(controlplane.ControllerNamespace)
	// The Students deleted so far go first (their finalizers ran): the backup puts
	// their rows back owned, with nobody left to delete them.
	if err := w.waitDeletedGone(ctx); err != nil {
		return time.Time{}, err
	}
	if err := w.ctrl.hold(); err != nil {
		return time.Time{}, err
	}
	w.checker.watcher.pause()
	if w.pg == nil {
		path := strings.TrimPrefix(w.registryURL, "sqlite://")
		err = w.db.reopen(func() error {
			for _, f := range []string{path + "-wal", path + "-shm"} {
				if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
					return err
				}
			}
			data, err := os.ReadFile(b.path) // #nosec G304 -- the run's own backup
			if err != nil {
				return err
			}
			return os.WriteFile(path, data, 0o600)
		})
	} else {
		out, restoreErr := exec.CommandContext(ctx, filepath.Join(pgtest.BinDir(), "pg_restore"), "--clean", "--if-exists", "--single-transaction", // #nosec G204 -- PostgreSQL's own tool
			"--dbname="+w.pg.URL("registry", true), b.path).CombinedOutput()
		if restoreErr != nil {
			err = fmt.Errorf("pg_restore: %v\n%s", restoreErr, out)
		}
	}
	if err != nil {
		return time.Time{}, err
	}
	w.checker.watcher.resume()

	// The Students go on changing while the controller is down; it comes back once
	// they all have, so that every deleted Student is known to be gone or going.
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		return !w.loader.running.Load(), nil
	}); err != nil {
		return time.Time{}, fmt.Errorf("the load did not end: %w", err)
	}
	if w.checker.restored, err = w.whatTheBackupLeft(ctx, ph); err != nil {
		return time.Time{}, err
	}
	w.ctrl.unhold()

	// Behind: the controller says so in the ConfigMap; an operator confirms.
	var confirmed string
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		err := clientretry.RetryOnConflict(clientretry.DefaultRetry, func() error {
			cm, err := cms.Get(ctx, markConfigMap, metav1.GetOptions{})
			if err != nil || cm.Data["behind"] == "" {
				return err
			}
			if cm.Annotations == nil {
				cm.Annotations = map[string]string{}
			}
			cm.Annotations[annotationConfirms] = cm.Data["mark"]
			if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
				return err
			}
			confirmed = cm.Data["mark"]
			return nil
		})
		return confirmed != "", err
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("the controller did not find the registry behind the cluster's mark: %w", err)
	}
	// The controller takes the confirmation: the ConfigMap follows the registry again.
	var cm *corev1.ConfigMap
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		cm, err = cms.Get(ctx, markConfigMap, metav1.GetOptions{})
		return err == nil && cm.Data["behind"] == "" && cm.Annotations[annotationConfirms] == "", nil
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("the controller did not take the confirmation of mark %s: %w (ConfigMap %+v)", confirmed, err, cm)
	}
	return time.Now(), nil
}

// waitDeletedGone waits until the API server has none of the Students deleted so far.
func (w *world) waitDeletedGone(ctx context.Context) error {
	deleted := map[string]bool{}
	for _, s := range w.loader.all {
		s.mu.Lock()
		if s.deleted {
			deleted[string(s.uid)] = true
		}
		s.mu.Unlock()
	}
	students := versioned.NewForConfigOrDie(w.cluster.admin).BolingcavalryV1().Students(metav1.NamespaceAll)
	left := 0
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := students.List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		left = 0
		for _, s := range list.Items {
			if deleted[string(s.UID)] {
				left++
			}
		}
		return left == 0, nil
	})
	if err != nil {
		return fmt.Errorf("%d deleted Students still there: %w", left, err)
	}
	return nil
}

// whatTheBackupLeft reads the registry as the backup put it back and the Students as
// the API server has them, with the controller down and the load over, and counts
// into ph what the controller has to do.
func (w *world) whatTheBackupLeft(ctx context.Context, ph *phaseResult) (*restoredRows, error) {
	rows, err := readRows(ctx, w.db.get())
	if err != nil {
		return nil, err
	}
	list, err := versioned.NewForConfigOrDie(w.cluster.admin).BolingcavalryV1().Students(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	there := map[string]bool{}
	for _, s := range list.Items {
		there[string(s.UID)] = true
		r, ok := rows[string(s.UID)]
		if s.DeletionTimestamp == nil && (!ok || r.owner != owner || r.generation < s.Generation) {
			ph.RowsToWriteBack++
		}
	}
	left := &restoredRows{ownedWithoutStudent: map[string]bool{}, lost: map[string]bool{}}
	for _, s := range w.loader.all {
		s.mu.Lock()
		uid, deleted := string(s.uid), s.deleted
		s.mu.Unlock()
		if uid == "" || !deleted {
			continue
		}
		r, hasRow := rows[uid]
		switch {
		case hasRow && r.owner == owner && !there[uid]:
			left.ownedWithoutStudent[uid] = true
		case !hasRow && s.policy == studentv1.DeletionPolicyOrphan:
			left.lost[uid] = true
		}
	}
	ph.RowsToRelease, ph.RowsLost = len(left.ownedWithoutStudent), len(left.lost)
	return left, nil
}
