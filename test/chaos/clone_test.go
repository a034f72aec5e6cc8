package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/student-controller/student-controller/internal/testenv"
	"github.com/student-controller/student-controller/internal/testenv/controlplane"
	"github.com/student-controller/student-controller/internal/testenv/ctrlbin"
	"github.com/student-controller/student-controller/pkg/generated/clientset/versioned"
)

// clone strikes faultClone: etcd stops for a moment while its data is copied (the
// snapshot), a second control plane starts from the copy (the clone keeps kube-system's
// UID, so the cluster binding cannot tell it from production), and a controller of the
// clone with production's registry and owner starts while the clone tears down a
// namespace's Students. It must wait for production's fence and write nothing; then
// the clone goes.
func (w *world) clone(ctx context.Context, ph *phaseResult) (healed time.Time, takeover time.Duration, err error) {
	c := w.cluster
	if err := c.Etcd.Stop(30 * time.Second); err != nil {
		return time.Time{}, 0, err
	}
	cloneDir := filepath.Join(w.dir, "clone")
	if err := os.MkdirAll(cloneDir, 0o700); err != nil {
		return time.Time{}, 0, err
	}
	out, copyErr := exec.Command("cp", "-a", filepath.Join(c.Dir, "etcd"), filepath.Join(cloneDir, "etcd")).CombinedOutput() // #nosec G204 -- the run's own folders
	if err := c.StartEtcd(ctx); err != nil {
		return time.Time{}, 0, err
	}
	if err := c.WaitReady(ctx); err != nil {
		return time.Time{}, 0, err
	}
	restarted := time.Now()
	if copyErr != nil {
		return time.Now(), 0, fmt.Errorf("copy etcd's data: %v: %s", copyErr, out)
	}
	// The copy cost production its Lease (etcd was down longer than the renew
	// deadline), and its leader gave the fence back. A clone's controller that starts
	// before production's writes again takes the free fence: the fence keeps two
	// writers apart, and cannot tell production from its copy (docs/backup-and-restore.md). A
	// real snapshot is taken while production runs, so the clone starts beside a
	// production controller that holds the fence, as here. The leader of before the
	// copy may still say it holds the fence, then find its Lease lost and give the fence
	// back after draining: wait for a Lease renewed since etcd came back, then for a
	// writer that keeps the fence past the renew deadline.
	if err := w.waitLeaseRenewed(ctx, restarted, time.Minute); err != nil {
		return time.Now(), 0, err
	}
	if err := w.ctrl.waitSteadyWriter(ctx, renewDeadline+time.Second, 2*time.Minute); err != nil {
		return time.Now(), 0, fmt.Errorf("production's controller does not write again after the copy: %w", err)
	}
	healed = time.Now() // production is whole again; the clone runs beside it
	clone, err := controlplane.Start(controlplane.Options{Root: c.Root, Dir: cloneDir, WithoutControllerManager: true})
	if clone != nil {
		defer func() { _ = clone.Stop() }()
	}
	if err != nil {
		return healed, 0, fmt.Errorf("start the clone: %w", err)
	}

	var args []string
	for i := 0; i < len(w.args); i++ {
		switch w.args[i] {
		case "--kubeconfig":
			args, i = append(args, "--kubeconfig", clone.Kubeconfig), i+1
		case "--leader-elect", "--sqlite-shared-file":
		case "--leader-elect-namespace", "--leader-elect-lease-duration", "--leader-elect-renew-deadline", "--leader-elect-retry-period":
			i++
		default:
			args = append(args, w.args[i])
		}
	}
	ctrl, err := ctrlbin.New("clone-controller", w.bin, filepath.Join(w.dir, "clone-controller.log"), args, w.env...)
	if err == nil {
		err = ctrl.Start()
	}
	if err != nil {
		return healed, 0, err
	}
	defer func() { _ = ctrl.Stop(50 * time.Second) }()

	// The clone's teardown: every Student of a namespace deleted.
	cloneClient := versioned.NewForConfigOrDie(clone.Config).BolingcavalryV1()
	if err := cloneClient.Students(namespaces[0]).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		return healed, 0, fmt.Errorf("the clone's teardown: %w", err)
	}
	// Long enough for the clone's controller to have tried, and tried again.
	time.Sleep(2*fenceLease + 2*time.Second)
	body, err := testenv.Scrape(ctrl.MetricsAddr, time.Second)
	if err != nil {
		return healed, 0, fmt.Errorf("the clone's controller's metrics: %w", err)
	}
	ph.CloneRowWrites = int(testenv.MetricSum(body, "student_controller_registry_rows_written_total", nil))
	ph.CloneHeldFence = testenv.MetricSum(body, "student_controller_registry_fence_held", nil) != 0
	ph.CloneWaited = testenv.MetricSum(body, "student_controller_registry_fence_waiting", nil) == 1
	if !ph.CloneWaited {
		return healed, 0, fmt.Errorf("the clone's controller does not say it waits for the fence (student_controller_registry_fence_waiting); "+
			"it holds the fence: %v, wrote %d rows", ph.CloneHeldFence, ph.CloneRowWrites)
	}
	return healed, 0, nil
}

// leaseName is the controllers' Lease: --leader-elect-id, as they run it (the default).
const leaseName = "student-controller"

// waitLeaseRenewed waits until the leader's Lease was renewed after since: its holder
// leads with a Lease of the running etcd, not one it may yet lose.
func (w *world) waitLeaseRenewed(ctx context.Context, since time.Time, timeout time.Duration) error {
	leases := kubernetes.NewForConfigOrDie(w.cluster.admin).CoordinationV1().Leases(controlplane.ControllerNamespace)
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		lease, err := leases.Get(ctx, leaseName, metav1.GetOptions{})
		if err != nil {
			return false, nil // the API server may still be reconnecting to etcd
		}
		return lease.Spec.RenewTime != nil && lease.Spec.RenewTime.After(since), nil
	})
	if err != nil {
		return fmt.Errorf("the Lease %s/%s was not renewed since etcd came back: %w", controlplane.ControllerNamespace, leaseName, err)
	}
	return nil
}
