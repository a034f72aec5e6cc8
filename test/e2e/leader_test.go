package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/student-controller/student-controller/internal/testenv"
	"github.com/student-controller/student-controller/internal/testenv/ctrlbin"
	"github.com/student-controller/student-controller/internal/testenv/registrytest"
)

// TestLeaderElection: two replicas with --leader-elect; only the leader writes. After
// SIGTERM the standby takes over and a new Student is Ready within 10 s; after a
// SIGKILL, within the lease duration plus 10 s.
func TestLeaderElection(t *testing.T) {
	ns := testenv.Namespace(t, kubeClient(), "e2e-")
	path := filepath.Join(t.TempDir(), "registry.db")
	leaseRBAC(t, ns)
	args := []string{
		"--kubeconfig", controllerID.Kubeconfig, "--namespace", ns,
		"--registry", "sqlite://" + path, "--registry-owner", owner,
		"--leader-elect", "--sqlite-shared-file", "--leader-elect-namespace", ns,
	}
	const leaseDuration = 15 * time.Second // the default

	a, b := startReplicas(t, ns, args)

	createMany(t, ns, 5, "s")
	waitAllReady(t, ns, 5, time.Minute)
	for _, p := range []*process{a, b} {
		_, body, err := get("http://" + p.MetricsAddr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		writes := 0
		for _, line := range metricLines(body, "rest_client_requests_total") {
			if !strings.Contains(line, `method="GET"`) {
				writes++
			}
		}
		// Every result is exported from the start, at 0: what counts is their sum.
		reconciles := testenv.MetricSum(body, "student_controller_reconcile_total", nil)
		leading := metricLines(body, "leader_election_master_status")
		if want := map[*process]string{a: " 1", b: " 0"}[p]; len(leading) != 1 || !strings.HasSuffix(leading[0], want) {
			t.Errorf("%s: leader_election_master_status %v, want%s", p.Name(), leading, want)
		}
		if p == b && (writes > 0 || reconciles > 0) {
			t.Errorf("the standby wrote or synced: %v %v", metricLines(body, "rest_client_requests_total"), metricLines(body, "student_controller_reconcile_total"))
		}
		if p == a && reconciles == 0 {
			t.Errorf("the leader synced nothing")
		}
	}

	// SIGTERM the leader: it drains, releases the Lease, exits 0; b takes over.
	a.signal(syscall.SIGTERM)
	terminated := time.Now()
	if _, err := students(ns).Create(context.Background(), newStudent("after-sigterm", "深圳中学", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitStudentReady(t, ns, "after-sigterm", terminated, 10*time.Second)
	if err := a.wait(30 * time.Second); err != nil {
		t.Errorf("replica a exited with %v after SIGTERM, want 0", err)
	}
	waitLeader(t, a, a, b)

	// SIGKILL the new leader, with a fresh standby: the Lease must expire first.
	c := startProcess(t, "replica-c", args...)
	waitFor(t, 30*time.Second, "replica c to be ready as a standby", func() bool {
		code, _, _ := get("http://" + c.ProbeAddr + "/readyz")
		return code == 200
	})
	b.signal(syscall.SIGKILL)
	killed := time.Now()
	if _, err := students(ns).Create(context.Background(), newStudent("after-sigkill", "深圳中学", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitStudentReady(t, ns, "after-sigkill", killed, leaseDuration+10*time.Second)
	assertRowsMatch(t, registrytest.OpenSQLite(t, path), waitAllReady(t, ns, 7, 10*time.Second))
}

// startReplicas starts replica a, waits until it leads (and the Lease student-controller
// in namespace leaseNS names a holder), then starts replica b and waits until it is
// ready as a standby.
func startReplicas(t *testing.T, leaseNS string, args []string) (a, b *process) {
	t.Helper()
	a = startProcess(t, "replica-a", args...)
	waitLeader(t, nil, a)
	lease, err := kubeClient().CoordinationV1().Leases(leaseNS).Get(context.Background(), "student-controller", metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
		t.Fatalf("replica a leads, but the Lease %s/student-controller has no holder: %v", leaseNS, err)
	}
	b = startProcess(t, "replica-b", args...)
	waitFor(t, 30*time.Second, "replica b to be ready as a standby", func() bool {
		code, _, _ := get("http://" + b.ProbeAddr + "/readyz")
		return code == 200
	})
	return a, b
}

// waitLeader waits until one of ps other than not leads (by its metrics; the Lease
// says the same once the elector has taken it).
func waitLeader(t *testing.T, not *process, ps ...*process) {
	t.Helper()
	var cs []*ctrlbin.Controller
	var notRun <-chan struct{}
	for _, p := range ps {
		cs = append(cs, p.Controller)
	}
	if not != nil {
		notRun = not.Exited()
	}
	if _, _, err := ctrlbin.WaitLeader(context.Background(), 30*time.Second, notRun, cs...); err != nil {
		t.Fatal(err)
	}
}

// waitStudentReady waits until a Student is Ready and fails if that took longer than
// limit since start.
func waitStudentReady(t *testing.T, ns, name string, start time.Time, limit time.Duration) {
	t.Helper()
	waitFor(t, limit+30*time.Second, fmt.Sprintf("Student %s Ready", name), func() bool {
		s, err := students(ns).Get(context.Background(), name, metav1.GetOptions{})
		return err == nil && isReady(s)
	})
	if took := time.Since(start); took > limit {
		t.Errorf("Student %s took %v to be Ready, more than %v", name, took.Round(100*time.Millisecond), limit)
	} else {
		t.Logf("Student %s Ready %v after the leader stopped", name, took.Round(100*time.Millisecond))
	}
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestPausedLeader: the leader paused (SIGSTOP) past its Lease, as a frozen VM or a long
// stall does, is replaced by the standby, which handles the Students changed, created
// and deleted during the pause. When the old leader resumes (SIGCONT) its cache is as
// old as the pause and its watch replays what it missed; it must write nothing, to the
// API or the registry, and stand down. It stops writing as soon as its last renewal is
// older than the renew deadline, before client-go's elector has noticed anything.
func TestPausedLeader(t *testing.T) {
	ns := testenv.Namespace(t, kubeClient(), "e2e-")
	path := filepath.Join(t.TempDir(), "registry.db")
	// The Lease in a namespace of its own: the elector's Events on it are not the
	// Students' Events that the resumed leader must not write.
	leaseNS := testenv.Namespace(t, kubeClient(), "e2e-")
	leaseRBAC(t, leaseNS)
	const leaseDuration = 4 * time.Second
	args := []string{
		"--kubeconfig", controllerID.Kubeconfig, "--namespace", ns,
		"--registry", "sqlite://" + path, "--registry-owner", owner,
		"--leader-elect", "--sqlite-shared-file", "--leader-elect-namespace", leaseNS,
		"--leader-elect-lease-duration", leaseDuration.String(), "--leader-elect-renew-deadline=3s", "--leader-elect-retry-period=1s",
		"-v=7", // every request is logged before it is sent
	}
	a, b := startReplicas(t, leaseNS, args)
	createMany(t, ns, 20, "s")
	waitAllReady(t, ns, 20, time.Minute)

	a.signal(syscall.SIGSTOP)
	paused := time.Now()
	ctx := context.Background()
	for i := range 10 {
		s, err := students(ns).Get(ctx, fmt.Sprintf("s-%03d", i), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s.Spec.School = "北京四中"
		if _, err := students(ns).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 10; i < 15; i++ {
		if err := students(ns).Delete(ctx, fmt.Sprintf("s-%03d", i), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	createMany(t, ns, 10, "paused")
	waitLeader(t, a, a, b)
	items := waitAllReady(t, ns, 25, time.Minute)
	if wait := leaseDuration + time.Second - time.Since(paused); wait > 0 {
		time.Sleep(wait)
	}

	resumedAt := len(a.Output())
	a.signal(syscall.SIGCONT)
	if err := a.wait(30 * time.Second); err == nil {
		t.Errorf("the resumed former leader exited 0, want an error: it lost the Lease")
	}
	var refused int
	for _, line := range strings.Split(a.Output()[resumedAt:], "\n") {
		request := strings.Contains(line, `"Request"`) && !strings.Contains(line, `verb="GET"`) &&
			(strings.Contains(line, "/students") || strings.Contains(line, "/namespaces/"+ns+"/events"))
		if request || strings.Contains(line, "Wrote registry row") || strings.Contains(line, "Registry row gone") {
			t.Errorf("the resumed former leader wrote: %s", line)
		}
		if strings.Contains(line, "Not writing; will retry") {
			refused++
		}
	}
	t.Logf("the resumed former leader refused %d syncs before it stood down", refused)
	assertRowsMatch(t, registrytest.OpenSQLite(t, path), items)
}
