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
)

// TestLeaderElection: two replicas with --leader-elect; only the leader writes. After
// SIGTERM the standby takes over and a new Student is Ready within 10 s; after a
// SIGKILL, within the lease duration plus 10 s.
func TestLeaderElection(t *testing.T) {
	ns := newNamespace(t)
	path := filepath.Join(t.TempDir(), "registry.db")
	leaseName := "student-controller-" + ns
	args := []string{
		"--kubeconfig", controllerID.kubeconfig, "--namespace", ns,
		"--registry", "sqlite://" + path, "--registry-owner", owner,
		"--leader-elect", "--leader-elect-namespace", systemNamespace, "--leader-elect-id", leaseName,
	}
	const leaseDuration = 15 * time.Second // the default

	a := startProcess(t, "replica-a", args...)
	holder := waitLeader(t, leaseName, "")
	b := startProcess(t, "replica-b", args...)
	waitFor(t, 30*time.Second, "replica b to be ready as a standby", func() bool {
		code, _, _ := get("http://" + b.probeAddr + "/readyz")
		return code == 200
	})

	createMany(t, ns, 5, "s")
	waitAllReady(t, ns, 5, time.Minute)
	for _, p := range []*process{a, b} {
		_, body, err := get("http://" + p.metricsAddr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		writes := 0
		for _, line := range metricLines(body, "rest_client_requests_total") {
			if !strings.Contains(line, `method="GET"`) {
				writes++
			}
		}
		reconciles := metricLines(body, "student_controller_reconcile_total")
		leading := metricLines(body, "leader_election_master_status")
		if want := map[*process]string{a: " 1", b: " 0"}[p]; len(leading) != 1 || !strings.HasSuffix(leading[0], want) {
			t.Errorf("%s: leader_election_master_status %v, want%s", p.name, leading, want)
		}
		if p == b && (writes > 0 || len(reconciles) > 0) {
			t.Errorf("the standby wrote or synced: %v %v", metricLines(body, "rest_client_requests_total"), reconciles)
		}
		if p == a && len(reconciles) == 0 {
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
	waitLeader(t, leaseName, holder)

	// SIGKILL the new leader, with a fresh standby: the Lease must expire first.
	c := startProcess(t, "replica-c", args...)
	waitFor(t, 30*time.Second, "replica c to be ready as a standby", func() bool {
		code, _, _ := get("http://" + c.probeAddr + "/readyz")
		return code == 200
	})
	b.signal(syscall.SIGKILL)
	killed := time.Now()
	if _, err := students(ns).Create(context.Background(), newStudent("after-sigkill", "深圳中学", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitStudentReady(t, ns, "after-sigkill", killed, leaseDuration+10*time.Second)
	assertRowsMatch(t, rawDB(t, path), waitAllReady(t, ns, 7, 10*time.Second))
}

// waitLeader waits until the Lease has a holder other than not, and returns it.
func waitLeader(t *testing.T, name, not string) string {
	t.Helper()
	var holder string
	waitFor(t, 30*time.Second, "a leader", func() bool {
		lease, err := kubeClient().CoordinationV1().Leases(systemNamespace).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil || lease.Spec.HolderIdentity == nil {
			return false
		}
		holder = *lease.Spec.HolderIdentity
		return holder != "" && holder != not
	})
	return holder
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
