package node

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/student-controller/student-controller/internal/testenv/node"
	"github.com/student-controller/student-controller/internal/testenv/pgtest"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// postgres is a PostgreSQL server on this machine that the node's Pods reach at the
// machine's address, with an empty database for one test, and the registry URL the
// Pods use (the password comes from the Secret student-registry).
type postgres struct {
	server *pgtest.Server
	url    string
	db     *sql.DB
}

func startPostgres(t *testing.T) *postgres {
	t.Helper()
	ctx := context.Background()
	pg := &postgres{server: pgtest.ForTest(t)}
	if err := pg.server.ListenFor(ctx, node.IP.String(), node.PodCIDR); err != nil {
		t.Fatal(err)
	}
	if err := pg.server.CreateDatabase(ctx, "students"); err != nil {
		t.Fatal(err)
	}
	pg.url = pg.server.HostURL("students", node.IP.String(), false)
	var err error
	if pg.db, err = sql.Open("pgx", pg.server.URL("students", true)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pg.db.Close() })
	return pg
}

// passwordSecret makes the Secret that config/postgres and the chart's
// registry.passwordSecret name, in the controller's namespace.
func (pg *postgres) passwordSecret(t *testing.T) {
	t.Helper()
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "student-registry", Namespace: systemNamespace},
		StringData: map[string]string{"password": pgtest.Password},
	}
	if _, err := kube.CoreV1().Secrets(systemNamespace).Create(context.Background(), secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// rows are the registry's rows by uid: the Student's name, school and owner.
func (pg *postgres) rows(t *testing.T) map[string]string {
	t.Helper()
	rs, err := pg.db.Query(`SELECT uid, student_name, school, COALESCE(owner, '') FROM students`)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	out := map[string]string{}
	for rs.Next() {
		var uid, name, school, owner string
		if err := rs.Scan(&uid, &name, &school, &owner); err != nil {
			t.Fatal(err)
		}
		out[uid] = name + "|" + school + "|" + owner
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// assertRows checks that every Student has its row, owned, with its spec.
func (pg *postgres) assertRows(t *testing.T, students []*studentv1.Student) {
	t.Helper()
	rows := pg.rows(t)
	for _, s := range students {
		got, ok := rows[string(s.UID)]
		if want := s.Spec.Name + "|" + s.Spec.School + "|"; !ok || !strings.HasPrefix(got, want) || got == want {
			t.Errorf("row of %s/%s: %q (found: %v), want %q and an owner", s.Namespace, s.Name, got, ok, want)
		}
	}
}

// TestPostgresKustomize: config/postgres, its registry pointed at this machine's
// PostgreSQL as an operator points it at theirs, runs two replicas that read the
// password Secret and write rows; one leads. Deleting the leader's Pod hands the Lease
// to the other within the lease duration, and a rolling update to a new image does the
// same; no Student is left behind and no row lost.
func TestPostgresKustomize(t *testing.T) {
	pg := startPostgres(t)
	dir := overlay(t, "config/postgres", fmt.Sprintf(`patches:
  - target: {kind: Deployment, name: student-controller}
    patch: |-
      - op: test
        path: /spec/template/spec/containers/0/args/4
        value: --registry=postgres://student_controller@postgres.databases.svc:5432/students?sslmode=verify-full
      - op: replace
        path: /spec/template/spec/containers/0/args/4
        value: --registry=%s
`, pg.url))
	cleanupInstall(t, "kustomize", dir)
	restrictedNamespace(t, systemNamespace)
	pg.passwordSecret(t)
	run(t, "kubectl", "apply", "-k", "config/crd")
	run(t, "kubectl", "apply", "-k", dir)
	readyPods(t, systemNamespace, 2, 3*time.Minute)
	diagnose := func() string { return describe(systemNamespace) }

	ns := "node-postgres-kustomize"
	studentNamespace(t, ns)
	var students []*studentv1.Student
	add := func(name string) {
		students = append(students, newStudent(t, ns, name, studentv1.DeletionPolicyDelete))
		waitReady(t, ns, name, diagnose)
	}
	add("before")
	pg.assertRows(t, students)

	// The leader's Pod is deleted: it drains, lets the Lease go, and the other leads.
	leader := leaderPod(t)
	deleted := time.Now()
	if err := kube.CoreV1().Pods(systemNamespace).Delete(context.Background(), leader, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	next := waitNewLeader(t, leader, handover)
	t.Logf("the Lease went from %s to %s in %s", leader, next, time.Since(deleted).Round(100*time.Millisecond))
	add("after-failover")

	// A rolling update to a new image: new Pods replace old ones one at a time, and the
	// Lease moves to a new Pod.
	digest, err := makeImage(context.Background(), "node-test-2")
	if err != nil {
		t.Fatal(err)
	}
	if digest == image.digest {
		t.Fatalf("a second version built the same image %s", digest)
	}
	newImage := image.repository + "@" + digest
	gaps := watchLeaderless(t)
	run(t, "kubectl", "-n", systemNamespace, "set", "image", "deployment/student-controller", "controller="+newImage)
	run(t, "kubectl", "-n", systemNamespace, "rollout", "status", "deployment/student-controller", "--timeout=3m")
	eventually(t, time.Minute, "a Pod of the new image leading", func(ctx context.Context) (bool, error) {
		pod, err := kube.CoreV1().Pods(systemNamespace).Get(ctx, leaderPodNow(ctx), metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		return pod.Spec.Containers[0].Image == newImage, nil
	}, diagnose)
	if longest := gaps(); longest >= handover {
		t.Errorf("during the rolling update no Pod led for %v, want less than %v (the lease duration is 15 s)", longest, handover)
	} else {
		t.Logf("during the rolling update the longest time no Pod led was %v", longest)
	}
	add("after-update")
	for _, s := range students {
		waitReady(t, ns, s.Name, diagnose)
	}
	pg.assertRows(t, students)

	out := run(t, "uninstall", "--yes", "kustomize", dir)
	assertUninstalled(t, out)
	if rows := pg.rows(t); len(rows) != 0 {
		t.Errorf("rows of Delete Students left after the uninstall: %v", rows)
	}
}

// overlay writes a kustomization over base (a folder of the repository) with more
// (kustomize fields) and the image set to the one `make image` built, as an operator's
// overlay would; it returns its folder.
func overlay(t *testing.T, base, more string) string {
	t.Helper()
	dir, err := os.MkdirTemp(filepath.Join(cp.Root, "bin"), "node-kustomize-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	rel, err := filepath.Rel(dir, filepath.Join(cp.Root, base))
	if err != nil {
		t.Fatal(err)
	}
	kustomization := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - %s\n"+
		"images:\n  - name: student-controller\n    newName: %s\n    digest: %s\n%s", rel, image.repository, image.digest, more)
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(kustomization), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// leaderPodNow is the Pod that holds the controller's Lease ("" if none does).
func leaderPodNow(ctx context.Context) string {
	lease, err := kube.CoordinationV1().Leases(systemNamespace).Get(ctx, "student-controller", metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil {
		return ""
	}
	// The identity is the Pod's host name (its name), "_", and a UUID.
	pod, _, _ := strings.Cut(*lease.Spec.HolderIdentity, "_")
	return pod
}

func leaderPod(t *testing.T) string {
	t.Helper()
	var leader string
	eventually(t, time.Minute, "a controller Pod leading", func(ctx context.Context) (bool, error) {
		leader = leaderPodNow(ctx)
		return leader != "", nil
	})
	return leader
}

// handover bounds how long no Pod leads when the leader's Pod is deleted: it lets the
// Lease go as it stops, so another takes over within a retry period (2 s), not the
// lease duration (15 s) it would wait out after a crash.
const handover = 8 * time.Second

// watchLeaderless samples the Lease until the function it returns is called, which
// returns the longest time the Lease named no Pod that exists (held by none, or by a
// Pod already gone). A Pod that drains while Terminating still leads.
func watchLeaderless(t *testing.T) func() time.Duration {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan time.Duration, 1)
	go func() {
		var longest time.Duration
		var since time.Time // when the Lease last began naming no Pod; zero while one leads
		for ctx.Err() == nil {
			now := time.Now()
			leaderless, known := false, true
			if name := leaderPodNow(ctx); name == "" {
				leaderless = true
			} else if _, err := kube.CoreV1().Pods(systemNamespace).Get(ctx, name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
				leaderless = true
			} else if err != nil {
				known = false // no answer: this sample says nothing
			}
			switch {
			case !known:
			case leaderless && since.IsZero():
				since = now
			case leaderless:
				longest = max(longest, now.Sub(since))
			case !since.IsZero():
				longest, since = max(longest, now.Sub(since)), time.Time{}
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
		done <- longest
	}()
	var once sync.Once
	var longest time.Duration
	stop := func() time.Duration {
		once.Do(func() { cancel(); longest = <-done })
		return longest
	}
	t.Cleanup(func() { stop() })
	return stop
}

// waitNewLeader waits until a Pod other than old holds the Lease, within within.
func waitNewLeader(t *testing.T, old string, within time.Duration) string {
	t.Helper()
	var next string
	eventually(t, within, "another Pod leading after "+old, func(ctx context.Context) (bool, error) {
		next = leaderPodNow(ctx)
		return next != "" && next != old, nil
	}, func() string { return describe(systemNamespace) })
	return next
}

// TestPostgresHelm: the chart with registry.passwordSecret runs on PostgreSQL and
// writes rows. Its probes are real: a controller frozen with SIGSTOP fails its liveness
// probe and the kubelet restarts it. With the registry down the Pod stays ready (the
// outage shows on the Students) and `kubectl drain` evicts it all the same.
func TestPostgresHelm(t *testing.T) {
	pg := startPostgres(t)
	cleanupInstall(t, "helm", "student-controller", systemNamespace)
	restrictedNamespace(t, systemNamespace)
	pg.passwordSecret(t)
	run(t, "helm", "install", "student-controller", "charts/student-controller", "--namespace", systemNamespace, "--take-ownership",
		"--set", "image.repository="+image.repository, "--set", "image.digest="+image.digest,
		"--set", "registry.url="+pg.url, "--set", "registry.passwordSecret.name=student-registry")
	pods := readyPods(t, systemNamespace, 1, 3*time.Minute)
	diagnose := func() string { return describe(systemNamespace) }
	ns := "node-postgres-helm"
	studentNamespace(t, ns)
	students := []*studentv1.Student{newStudent(t, ns, "first", studentv1.DeletionPolicyDelete)}
	waitReady(t, ns, "first", diagnose)
	pg.assertRows(t, students)

	t.Run("liveness", func(t *testing.T) {
		if err := nd.Signal(context.Background(), systemNamespace, pods[0].Name, "controller", syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		eventually(t, 3*time.Minute, "the kubelet restarting the frozen controller", func(ctx context.Context) (bool, error) {
			p, err := kube.CoreV1().Pods(systemNamespace).Get(ctx, pods[0].Name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount >= 1 && podReady(p), nil
		}, diagnose)
		// For its liveness probe, which the kubelet reports.
		events, err := kube.CoreV1().Events(systemNamespace).List(context.Background(), metav1.ListOptions{
			FieldSelector: "involvedObject.name=" + pods[0].Name + ",reason=Unhealthy"})
		if err != nil {
			t.Fatal(err)
		}
		liveness := false
		for _, e := range events.Items {
			liveness = liveness || strings.HasPrefix(e.Message, "Liveness probe failed")
		}
		if !liveness {
			t.Errorf("no Event says the liveness probe failed: %+v", events.Items)
		}
		students = append(students, newStudent(t, ns, "after-restart", studentv1.DeletionPolicyDelete))
		waitReady(t, ns, "after-restart", diagnose)
	})

	t.Run("drain with the registry down", func(t *testing.T) {
		if err := pg.server.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		restarted := false
		t.Cleanup(func() {
			_, _ = tryRun("kubectl", "uncordon", node.Name)
			if !restarted {
				_ = pg.server.Start(context.Background())
			}
		})
		s := newStudent(t, ns, "during-outage", studentv1.DeletionPolicyDelete)
		eventually(t, time.Minute, "the outage shown on Student during-outage", func(ctx context.Context) (bool, error) {
			got, err := stu.BolingcavalryV1().Students(ns).Get(ctx, s.Name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			c := meta.FindStatusCondition(got.Status.Conditions, studentv1.ConditionReady)
			return c != nil && c.Status == metav1.ConditionFalse, nil
		}, diagnose)
		// Readiness does not ask the registry: the Pod stays ready through the outage
		// (the readiness probe runs every 5 s, and 3 failures would show).
		for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(time.Second) {
			if ready := readyPodsNow(context.Background()); len(ready) != 1 {
				t.Fatalf("%d controller Pods ready during the registry outage, want 1: readiness does not ask the registry\n%s", len(ready), diagnose())
			}
		}
		run(t, "kubectl", "drain", node.Name, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=3m")
		run(t, "kubectl", "uncordon", node.Name)
		if err := pg.server.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		restarted = true
		readyPods(t, systemNamespace, 1, 3*time.Minute)
		students = append(students, s)
		waitReady(t, ns, s.Name, diagnose)
	})
	pg.assertRows(t, students)

	out := run(t, "uninstall", "--yes", "helm", "student-controller", systemNamespace)
	assertUninstalled(t, out)
	if rows := pg.rows(t); len(rows) != 0 {
		t.Errorf("rows of Delete Students left after the uninstall: %v", rows)
	}
}
