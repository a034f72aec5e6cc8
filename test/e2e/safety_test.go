package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/student-controller/student-controller/internal/registry"
	"github.com/student-controller/student-controller/internal/testenv"
	"github.com/student-controller/student-controller/internal/testenv/controlplane"
	"github.com/student-controller/student-controller/internal/testenv/ctrlbin"
	"github.com/student-controller/student-controller/internal/testenv/pgtest"
	"github.com/student-controller/student-controller/internal/testenv/registrytest"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
	"github.com/student-controller/student-controller/pkg/generated/clientset/versioned"
)

// TestWrongClusterDeletesNothing: rows written by a controller of one cluster; the same
// binary, registry and owner started against another cluster (which has the CRD and
// none of those Students) refuses to write and says how to move the owner, and every
// row stays. After the explicit move the first cluster's controller is the one that
// refuses.
func TestWrongClusterDeletesNothing(t *testing.T) {
	t.Parallel()
	ns := testenv.Namespace(t, kubeClient(), "e2e-")
	path := filepath.Join(t.TempDir(), "registry.db")
	db := registrytest.OpenSQLite(t, path)
	common := []string{"--registry", "sqlite://" + path, "--registry-owner", owner, "--sweep-interval", "500ms"}

	a := startProcess(t, "controller of cluster A", append([]string{"--kubeconfig", controllerID.Kubeconfig, "--namespace", ns}, common...)...)
	createMany(t, ns, 3, "a")
	assertRowsMatch(t, db, waitAllReady(t, ns, 3, time.Minute))
	a.signal(syscall.SIGTERM)
	if err := a.wait(45 * time.Second); err != nil {
		t.Fatalf("controller of cluster A: %v", err)
	}
	before := rowsOf(t, db)

	other := controlplane.ForTest(t, controlplane.Options{})
	b := startProcess(t, "controller of cluster B", append([]string{"--kubeconfig", other.Kubeconfig}, common...)...)
	select {
	case <-b.Exited():
		if code := exitCode(b.ExitErr()); code != 1 || !strings.Contains(b.Output(), "is bound to cluster") ||
			!strings.Contains(b.Output(), "student-controller registry move-cluster") {
			t.Errorf("controller of cluster B: exit %d, want 1 with the binding and the way to move it in its output", code)
		}
	case <-time.After(30 * time.Second):
		t.Error("controller of cluster B still runs after 30 s; want it to refuse at once")
	}
	if diff := rowsDiff(before, rowsOf(t, db)); diff != "" {
		t.Errorf("the rows changed after a controller of another cluster ran:\n%s", diff)
	}

	// The explicit move: the owner now follows cluster B.
	from := clusterUID(t)
	out, err := exec.Command(ctrlbin.Binary(t), "registry", "move-cluster", "--kubeconfig", other.Kubeconfig,
		"--registry", "sqlite://"+path, "--registry-owner", owner, "--from", from).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "is bound to cluster") {
		t.Fatalf("registry move-cluster: %v\n%s", err, out)
	}
	a2 := startProcess(t, "controller of cluster A again", append([]string{"--kubeconfig", controllerID.Kubeconfig, "--namespace", ns}, common...)...)
	if err := a2.wait(30 * time.Second); exitCode(err) != 1 {
		t.Errorf("controller of cluster A after the move: %v, want exit 1", err)
	}
}

// clusterUID is the shared control plane's identity: its kube-system namespace's UID.
func clusterUID(t *testing.T) string {
	t.Helper()
	ns, err := kubeClient().CoreV1().Namespaces().Get(context.Background(), "kube-system", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return string(ns.UID)
}

// rowsDiff lists the rows that differ between two reads.
func rowsDiff(before, after map[string]registry.Record) string {
	var b strings.Builder
	for uid, r := range before {
		if a, ok := after[uid]; !ok {
			b.WriteString("gone: " + uid + "\n")
		} else if a != r {
			b.WriteString("changed: " + uid + "\n")
		}
	}
	for uid := range after {
		if _, ok := before[uid]; !ok {
			b.WriteString("new: " + uid + "\n")
		}
	}
	return b.String()
}

// TestLostFinalizerKeepsOrphanRow: an Orphan Student whose finalizer was removed behind
// the controller's back (by hand, or by a second release) and that was then deleted:
// the sweep finds its row without a Student and releases it, as the Student asked,
// instead of deleting it.
func TestLostFinalizerKeepsOrphanRow(t *testing.T) {
	registrytest.ForEach(t, pg, testLostFinalizerKeepsOrphanRow)
}

func testLostFinalizerKeepsOrphanRow(t *testing.T, b registrytest.Backend) {
	ctx := context.Background()
	ns := testenv.Namespace(t, kubeClient(), "e2e-")
	url, db := b.New(t)
	c := startController(t, controllerOptions{registryURL: url, namespace: ns, sweepInterval: 500 * time.Millisecond})
	createMany(t, ns, 2, "d")
	if _, err := students(ns).Create(ctx, newStudent("kept", "深圳中学", studentv1.DeletionPolicyOrphan), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	items := waitAllReady(t, ns, 3, time.Minute)
	c.stop()

	kept, err := students(ns).Get(ctx, "kept", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kept.Finalizers = nil
	if _, err := students(ns).Update(ctx, kept, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := students(ns).Delete(ctx, "kept", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	startController(t, controllerOptions{registryURL: url, namespace: ns, sweepInterval: 500 * time.Millisecond})
	eventually(t, 30*time.Second, "the sweep to let go of the row of the deleted Orphan Student", func(context.Context) (bool, error) {
		return rowsOf(t, db)[string(kept.UID)].Owner == "", nil
	})
	row, ok := rowsOf(t, db)[string(kept.UID)]
	if !ok || row.StudentName != kept.Spec.Name || row.School != kept.Spec.School {
		t.Errorf("the Orphan Student's row: %+v, %v; want it kept, released, with its spec", row, ok)
	}
	var live []studentv1.Student
	for _, s := range items {
		if s.Name != "kept" {
			live = append(live, s)
		}
	}
	assertRowsMatch(t, db, live)
}

// TestControlCharactersRefused: the API server refuses a spec with a character the
// registry cannot hold (NUL, which PostgreSQL's TEXT refuses) or shows as nothing; and
// a Student stored with one before the CRD refused it is reported as invalid, and its
// deletion finishes with its row released as last written.
func TestControlCharactersRefused(t *testing.T) {
	ctx := context.Background()
	ns := testenv.Namespace(t, kubeClient(), "e2e-")
	for _, spec := range []studentv1.StudentSpec{{Name: "a\x00b", School: "s"}, {Name: "a", School: "line\nbreak"}} {
		_, err := students(ns).Create(ctx, &studentv1.Student{ObjectMeta: metav1.ObjectMeta{GenerateName: "control-"}, Spec: spec}, metav1.CreateOptions{})
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "control characters") {
			t.Errorf("create with spec %q: %v; want Invalid, naming control characters", spec, err)
		}
	}

	// On PostgreSQL, with an Orphan Student whose spec got a NUL past an older CRD.
	pgBackend := registrytest.PostgresBackend(pg)
	url, db := pgBackend.New(t)
	startController(t, controllerOptions{registryURL: url, namespace: ns})
	if _, err := students(ns).Create(ctx, newStudent("older", "深圳中学", studentv1.DeletionPolicyOrphan), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s := waitAllReady(t, ns, 1, time.Minute)[0]
	withoutControlRule(t, func() {
		eventually(t, 30*time.Second, "the older CRD to take a NUL", func(ctx context.Context) (bool, error) {
			cur, err := students(ns).Get(ctx, "older", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			cur.Spec.Name = "a\x00b"
			_, err = students(ns).Update(ctx, cur, metav1.UpdateOptions{})
			return err == nil, nil
		})
	})
	eventually(t, 30*time.Second, "the Student reported as invalid", func(ctx context.Context) (bool, error) {
		cur, err := students(ns).Get(ctx, "older", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range cur.Status.Conditions {
			if c.Type == studentv1.ConditionReady && c.Reason == studentv1.ReasonInvalidSpec {
				return true, nil
			}
		}
		return false, nil
	})
	if err := students(ns).Delete(ctx, "older", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the deletion to finish", func(ctx context.Context) (bool, error) {
		_, err := students(ns).Get(ctx, "older", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if row := rowsOf(t, db)[string(s.UID)]; row.Owner != "" || row.StudentName != s.Spec.Name {
		t.Errorf("row after the deletion: %+v; want it released with its last stored name %q", row, s.Spec.Name)
	}
}

// withoutControlRule runs fn while the Student CRD lacks its control-character rule on
// spec.name, as a CRD from before the rule did, and puts the rule back.
func withoutControlRule(t *testing.T, fn func()) {
	t.Helper()
	crd := "customresourcedefinition/students.bolingcavalry.k8s.io"
	const path = "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/name/x-kubernetes-validations/1"
	restore := func() {
		out, err := exec.Command("kubectl", "--kubeconfig", env.Kubeconfig, "apply", "--server-side", "--force-conflicts",
			"-f", filepath.Join(env.Root, "config", "crd", "bases")).CombinedOutput()
		if err != nil {
			t.Errorf("put the CRD back: %v\n%s", err, out)
		}
	}
	defer restore()
	out, err := exec.Command("kubectl", "--kubeconfig", env.Kubeconfig, "patch", crd, "--type=json",
		`-p=[{"op": "test", "path": "`+path+`/message", "value": "must not hold control characters (U+0000 to U+001F, U+007F)"}, {"op": "remove", "path": "`+path+`"}]`).CombinedOutput()
	if err != nil {
		t.Fatalf("take the rule out of the CRD: %v\n%s", err, out)
	}
	fn()
}

// TestRenameOwner: `registry rename-owner` hands an owner's rows to a new owner mark,
// and a controller started with the new mark takes them over; without it every row
// would stay RowOwnedElsewhere, and the rows of Delete Students would outlive them.
func TestRenameOwner(t *testing.T) {
	ns := testenv.Namespace(t, kubeClient(), "e2e-")
	path := filepath.Join(t.TempDir(), "registry.db")
	db := registrytest.OpenSQLite(t, path)
	run := func(owner string) *process {
		return startProcess(t, "controller "+owner, "--kubeconfig", controllerID.Kubeconfig, "--namespace", ns,
			"--registry", "sqlite://"+path, "--registry-owner", owner)
	}
	old := run(owner)
	createMany(t, ns, 2, "r")
	waitAllReady(t, ns, 2, time.Minute)
	old.signal(syscall.SIGTERM)
	if err := old.wait(45 * time.Second); err != nil {
		t.Fatal(err)
	}

	const renamed = "renamed-controller"
	out, err := exec.Command(ctrlbin.Binary(t), "registry", "rename-owner", "--registry", "sqlite://"+path,
		"--registry-owner", owner, "--to", renamed).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "2 rows") {
		t.Fatalf("registry rename-owner: %v\n%s", err, out)
	}
	run(renamed)
	if err := students(ns).Delete(context.Background(), "r-000", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the deleted Student's row gone and the other's owned by the new mark", func(ctx context.Context) (bool, error) {
		if _, err := students(ns).Get(ctx, "r-000", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return false, nil
		}
		rows := rowsOf(t, db)
		return len(rows) == 1 && func() bool {
			for _, r := range rows {
				return r.Owner == renamed
			}
			return false
		}(), nil
	})
}

// TestStartsBeforeTheRegistry: with PostgreSQL down at start the controller does not
// crash-loop: its probes answer at once (alive, not ready) and it keeps trying; once
// the server is up it opens the registry, becomes ready and syncs.
func TestStartsBeforeTheRegistry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := testenv.Namespace(t, kubeClient(), "e2e-")
	server := pgtest.ForTest(t) // a server of its own: it is stopped below
	url, db := registrytest.PostgresBackend(server).New(t)
	if err := server.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	url, password := registrytest.ForProcess(t, url)
	p := startProcess(t, "controller", append([]string{"--kubeconfig", controllerID.Kubeconfig, "--namespace", ns, "--registry", url,
		"--registry-owner", owner}, password...)...)
	waitFor(t, 10*time.Second, "the probes to answer", func() bool {
		code, _, err := get("http://" + p.ProbeAddr + "/healthz")
		return err == nil && code == 200
	})
	time.Sleep(3 * time.Second) // a few attempts to open the registry
	select {
	case <-p.Exited():
		t.Fatalf("the controller exited while the registry was down: %v", p.ExitErr())
	default:
	}
	if code, body, err := get("http://" + p.ProbeAddr + "/readyz"); err != nil || code != 503 {
		t.Errorf("/readyz with the registry down: %d %q %v, want 503", code, body, err)
	}
	if err := server.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := students(ns).Create(ctx, newStudent("zhang-san", "深圳中学", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	assertRowsMatch(t, db, waitAllReady(t, ns, 1, time.Minute))
	if code, _, err := get("http://" + p.ProbeAddr + "/readyz"); err != nil || code != 200 {
		t.Errorf("/readyz once the registry is up: %d %v, want 200", code, err)
	}
}

// TestAdmissionPolicyScoped: a release that watches some namespaces and labels binds
// its admission policy to that scope alone: a Student outside it gets no finalizer that
// no controller would ever remove (it would stay Terminating, and its namespace with
// it).
func TestAdmissionPolicyScoped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cp := controlplane.ForTest(t, controlplane.Options{WithoutAdmissionPolicy: true})
	kube := kubernetes.NewForConfigOrDie(cp.Config)
	stus := versioned.NewForConfigOrDie(cp.Config).BolingcavalryV1()
	install := exec.Command(filepath.Join(cp.Root, "bin", "tools", "helm"), "install", "team-a", filepath.Join(cp.Root, "charts", "student-controller"),
		"--namespace", "controllers-a", "--create-namespace", "--set", "crds.enabled=false", "--set", "registry.owner=team-a", "--set", "watchNamespace={school-a,school-c}",
		"--set", "watchSelector.matchLabels.team=blue", "--kubeconfig", cp.Kubeconfig)
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	for _, ns := range []string{"school-a", "school-b", "school-c"} {
		if err := testenv.EnsureNamespace(ctx, kube, ns); err != nil {
			t.Fatal(err)
		}
	}
	student := func(team string) *studentv1.Student {
		s := &studentv1.Student{ObjectMeta: metav1.ObjectMeta{GenerateName: "s-"}, Spec: studentv1.StudentSpec{Name: "A", School: "S"}}
		if team != "" {
			s.Labels = map[string]string{"team": team}
		}
		return s
	}
	// A new policy takes effect within moments: Students in the scope show when it has.
	eventually(t, 30*time.Second, "the policy to put the finalizer on a Student of school-a", func(ctx context.Context) (bool, error) {
		s, err := stus.Students("school-a").Create(ctx, student("blue"), metav1.CreateOptions{})
		return err == nil && slices.Contains(s.Finalizers, "bolingcavalry.k8s.io/registry-row"), nil // errors: the CRD is new
	})
	for _, tc := range []struct {
		namespace, team string
		want            bool
	}{{"school-c", "blue", true}, {"school-b", "blue", false}, {"school-a", "", false}, {"school-a", "red", false}} {
		s, err := stus.Students(tc.namespace).Create(ctx, student(tc.team), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := slices.Contains(s.Finalizers, "bolingcavalry.k8s.io/registry-row"); got != tc.want {
			t.Errorf("a Student of %s labeled team=%q: finalizers %v, want the controller's: %v", tc.namespace, tc.team, s.Finalizers, tc.want)
		}
	}
}
