package e2e

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/student-controller/student-controller/internal/testenv"
	"github.com/student-controller/student-controller/internal/testenv/controlplane"
	"github.com/student-controller/student-controller/internal/testenv/registrytest"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
	"github.com/student-controller/student-controller/pkg/generated/clientset/versioned"
)

// uninstallCluster is a control plane of its own for an uninstall, with a controller
// running on a SQLite registry and Students of both policies.
type uninstallCluster struct {
	cp       *controlplane.Env
	kube     kubernetes.Interface
	students versioned.Interface
	registry string
	db       *sql.DB
	args     []string
	uids     map[string]studentv1.DeletionPolicy
}

func newUninstallCluster(t *testing.T) *uninstallCluster {
	t.Helper()
	cp := controlplane.ForTest(t, controlplane.Options{})
	u := &uninstallCluster{cp: cp, kube: kubernetes.NewForConfigOrDie(cp.Config), students: versioned.NewForConfigOrDie(cp.Config),
		registry: filepath.Join(t.TempDir(), "registry.db"), uids: map[string]studentv1.DeletionPolicy{}}
	u.db = registrytest.OpenSQLite(t, u.registry)
	u.args = []string{"--kubeconfig", cp.Kubeconfig, "--registry", "sqlite://" + u.registry, "--registry-owner", owner}
	return u
}

// populate makes two namespaces with Students of both policies and waits until they
// are Ready.
func (u *uninstallCluster) populate(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	for _, ns := range []string{"school-a", "school-b"} {
		if err := testenv.EnsureNamespace(ctx, u.kube, ns); err != nil {
			t.Fatal(err)
		}
		for i, policy := range []studentv1.DeletionPolicy{"Delete", "Delete", "Orphan", "Delete", "Orphan"} {
			s, err := u.students.BolingcavalryV1().Students(ns).Create(ctx, newStudent(fmt.Sprintf("s-%d", i), "深圳中学", policy), metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			u.uids[string(s.UID)] = policy
		}
		waitAllReadyIn(t, u.students.BolingcavalryV1().Students(ns), 5, time.Minute)
	}
}

// overlay writes a kustomize overlay of config/default whose controller has args
// after its own, and returns its folder.
func (u *uninstallCluster) overlay(t *testing.T, args ...string) string {
	t.Helper()
	dir := t.TempDir()
	base, err := filepath.Rel(dir, filepath.Join(u.cp.Root, "config", "default"))
	if err != nil {
		t.Fatal(err)
	}
	var ops []map[string]string
	for _, arg := range args {
		ops = append(ops, map[string]string{"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": arg})
	}
	patch, err := json.Marshal(ops)
	if err != nil {
		t.Fatal(err)
	}
	kustomization := fmt.Sprintf("resources: [%s]\npatches:\n  - target: {kind: Deployment, name: student-controller}\n    patch: '%s'\n", base, patch)
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(kustomization), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// uninstall runs hack/uninstall.sh --yes on the cluster: kustomize, or helm RELEASE
// NAMESPACE.
func (u *uninstallCluster) uninstall(timeout string, how ...string) (string, error) {
	if len(how) == 0 {
		how = []string{"kustomize"}
	}
	if how[0] != "--ask" {
		how = append([]string{"--yes"}, how...)
	} else {
		how = how[1:]
	}
	cmd := exec.Command(filepath.Join(u.cp.Root, "hack", "uninstall.sh"), how...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+u.cp.Kubeconfig, "UNINSTALL_TIMEOUT="+timeout,
		"HELM="+filepath.Join(u.cp.Root, "bin", "tools", "helm"))
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// assertNothingLeft checks the end of an uninstall: no Student, the CRD kept (no
// uninstall deletes it), the namespaces that held Students deleted for good, and the
// rows per policy: Delete rows gone, Orphan rows kept and released.
func (u *uninstallCluster) assertNothingLeft(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	if list, err := u.students.BolingcavalryV1().Students("").List(ctx, metav1.ListOptions{}); err != nil || len(list.Items) != 0 {
		t.Errorf("Students after the uninstall: %v, %v; want none, and the CRD still served", list, err)
	}
	for _, ns := range []string{"school-a", "school-b"} {
		if err := u.kube.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
	eventually(t, time.Minute, "the namespaces gone, none left Terminating", func(ctx context.Context) (bool, error) {
		for _, ns := range []string{"school-a", "school-b"} {
			if _, err := u.kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return false, nil
			}
		}
		return true, nil
	})
	rows := rowsOf(t, u.db)
	for uid, policy := range u.uids {
		row, ok := rows[uid]
		switch {
		case policy == studentv1.DeletionPolicyDelete && ok:
			t.Errorf("row %s (Delete) still there: %+v", uid, row)
		case policy == studentv1.DeletionPolicyOrphan && !ok:
			t.Errorf("row %s (Orphan) lost", uid)
		case policy == studentv1.DeletionPolicyOrphan && row.Owner != "":
			t.Errorf("row %s (Orphan) not released: owner %q", uid, row.Owner)
		}
	}
}

// TestUninstall: hack/uninstall.sh, with the controller running, leaves no Student,
// CRD or namespace Terminating and the rows per policy, for kustomize and for Helm. With the controller already
// gone it deletes nothing and says so; running the controller again is the way out,
// and then the uninstall finishes the same.
//
// Each case has a control plane of its own, so the cases run in parallel (go test's
// -parallel, the number of CPUs by default): they spend most of their time waiting.
func TestUninstall(t *testing.T) {
	t.Run("controller running", func(t *testing.T) {
		t.Parallel()
		u := newUninstallCluster(t)
		ctrl := startProcess(t, "controller", u.args...)
		u.populate(t)
		// A paused Student's deletion waits until it is unpaused: the script does that.
		for _, key := range [][2]string{{"school-a", "s-1"}, {"school-b", "s-2"}} {
			pauseStudent(t, u.students, key[0], key[1], true)
		}
		// Without --yes and no terminal to ask on, nothing is done; the plan is shown.
		out, err := u.uninstall("2m", "--ask", "kustomize")
		if err == nil || !strings.Contains(out, "API server https://127.0.0.1:") || !strings.Contains(out, "every Student in the cluster (") ||
			!strings.Contains(out, "nothing done") {
			t.Errorf("hack/uninstall.sh without --yes: %v, want the context, the plan and a refusal:\n%s", err, out)
		}
		out, err = u.uninstall("2m")
		if err != nil {
			t.Fatalf("hack/uninstall.sh: %v\n%s", err, out)
		}
		if !strings.Contains(out, "unpausing Student school-a/s-1") || !strings.Contains(out, "unpausing Student school-b/s-2") {
			t.Errorf("hack/uninstall.sh did not say that it unpaused the paused Students:\n%s", out)
		}
		ctrl.signal(syscall.SIGTERM)
		u.assertNothingLeft(t)
	})

	t.Run("helm", func(t *testing.T) {
		t.Parallel()
		u := newUninstallCluster(t)
		helmBin := filepath.Join(u.cp.Root, "bin", "tools", "helm")
		// The control plane has the admission policy already, outside the release. (Its
		// Deployment never runs here, with no kubelet: the controller is the process.)
		// The release takes the CRD the control plane installed, as an upgrade from a
		// chart that kept it in crds/ does; the uninstall keeps it.
		install := exec.Command(helmBin, "install", "student-controller", filepath.Join(u.cp.Root, "charts", "student-controller"),
			"--namespace", "student-controller-system", "--create-namespace", "--take-ownership", "--set", "admissionPolicy.enabled=false",
			"--kubeconfig", u.cp.Kubeconfig)
		if out, err := install.CombinedOutput(); err != nil {
			t.Fatalf("helm install (bin/tools/helm: make helm builds it): %v\n%s", err, out)
		}
		ctrl := startProcess(t, "controller", u.args...)
		u.populate(t)
		if out, err := u.uninstall("2m", "helm", "student-controller", "student-controller-system"); err != nil {
			t.Fatalf("hack/uninstall.sh helm: %v\n%s", err, out)
		}
		ctrl.signal(syscall.SIGTERM)
		u.assertNothingLeft(t)
		if _, err := u.kube.AppsV1().Deployments("student-controller-system").Get(context.Background(), "student-controller", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("the release's Deployment after the uninstall: %v", err)
		}
	})

	// Two releases, each watching a namespace of its own, with owners of their own:
	// uninstalling one deletes its Students only, and the CRD, which that one renders
	// (the other sets crds.enabled=false), stays for the other's.
	t.Run("one of two releases", func(t *testing.T) {
		t.Parallel()
		u := newUninstallCluster(t)
		helmBin := filepath.Join(u.cp.Root, "bin", "tools", "helm")
		for _, team := range []string{"a", "b"} {
			crds := map[string]string{"a": "--take-ownership", "b": "--set=crds.enabled=false"}[team]
			install := exec.Command(helmBin, "install", "team-"+team, filepath.Join(u.cp.Root, "charts", "student-controller"),
				"--namespace", "controllers-"+team, "--create-namespace", crds, "--set", "admissionPolicy.enabled=false",
				"--set", "registry.owner=team-"+team, "--set", "watchNamespace=school-"+team, "--kubeconfig", u.cp.Kubeconfig)
			if out, err := install.CombinedOutput(); err != nil {
				t.Fatalf("helm install: %v\n%s", err, out)
			}
			startProcess(t, "controller-"+team, "--kubeconfig", u.cp.Kubeconfig, "--registry", "sqlite://"+u.registry,
				"--registry-owner", "team-"+team, "--namespace", "school-"+team)
		}
		u.populate(t)
		out, err := u.uninstall("2m", "helm", "team-a", "controllers-a")
		if err != nil {
			t.Fatalf("hack/uninstall.sh helm team-a: %v\n%s", err, out)
		}
		if !strings.Contains(out, "the Students of namespace school-a") || !strings.Contains(out, "the CRD "+"students.bolingcavalry.k8s.io stays") {
			t.Errorf("hack/uninstall.sh output does not say what it did:\n%s", out)
		}
		ctx := context.Background()
		for ns, want := range map[string]int{"school-a": 0, "school-b": 5} {
			list, err := u.students.BolingcavalryV1().Students(ns).List(ctx, metav1.ListOptions{})
			if err != nil || len(list.Items) != want {
				t.Errorf("Students in %s after uninstalling team-a: %d, %v; want %d", ns, len(list.Items), err, want)
			}
		}
	})

	// Two releases watching the same two namespaces, each the Students of one label:
	// uninstalling one deletes the Students of its label alone. A flag the script
	// cannot read stops it before it deletes anything.
	t.Run("two namespaces, a label each", func(t *testing.T) {
		t.Parallel()
		u := newUninstallCluster(t)
		ctx := context.Background()
		helmBin := filepath.Join(u.cp.Root, "bin", "tools", "helm")
		for _, team := range []string{"a", "b"} {
			install := exec.Command(helmBin, "install", "team-"+team, filepath.Join(u.cp.Root, "charts", "student-controller"),
				"--namespace", "controllers-"+team, "--create-namespace", "--set", "crds.enabled=false", "--set", "admissionPolicy.enabled=false",
				"--set", "registry.owner=team-"+team, "--set", "watchNamespace={school-a,school-b}",
				"--set", "watchSelector.matchLabels.team="+team, "--kubeconfig", u.cp.Kubeconfig)
			if out, err := install.CombinedOutput(); err != nil {
				t.Fatalf("helm install: %v\n%s", err, out)
			}
			startProcess(t, "controller-"+team, "--kubeconfig", u.cp.Kubeconfig, "--registry", "sqlite://"+u.registry,
				"--registry-owner", "team-"+team, "--namespace", "school-a,school-b", "--selector", "team="+team)
		}
		for _, ns := range []string{"school-a", "school-b"} {
			if err := testenv.EnsureNamespace(ctx, u.kube, ns); err != nil {
				t.Fatal(err)
			}
			for i, policy := range []studentv1.DeletionPolicy{"Delete", "Orphan", "Delete", "Orphan"} {
				team := "a"
				if i >= 2 {
					team = "b"
				}
				s := newStudent(fmt.Sprintf("s-%d", i), "深圳中学", policy)
				s.Labels = map[string]string{"team": team}
				created, err := u.students.BolingcavalryV1().Students(ns).Create(ctx, s, metav1.CreateOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if s.Labels["team"] == "a" {
					u.uids[string(created.UID)] = policy
				}
			}
			waitAllReadyIn(t, u.students.BolingcavalryV1().Students(ns), 4, time.Minute)
		}

		overlay := u.overlay(t, "--selector", "team=a")
		if out, err := u.uninstall("2m", "kustomize", overlay); exitCode(err) != 1 || !strings.Contains(out, "cannot read") {
			t.Errorf("hack/uninstall.sh with --selector and its value apart: exit %d, want 1 and a refusal:\n%s", exitCode(err), out)
		}

		out, err := u.uninstall("2m", "helm", "team-a", "controllers-a")
		if err != nil {
			t.Fatalf("hack/uninstall.sh helm team-a: %v\n%s", err, out)
		}
		if !strings.Contains(out, "the Students labeled team=a of namespaces school-a, school-b") {
			t.Errorf("hack/uninstall.sh output does not say what it did:\n%s", out)
		}
		for _, ns := range []string{"school-a", "school-b"} {
			list, err := u.students.BolingcavalryV1().Students(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var left []string
			for _, s := range list.Items {
				left = append(left, s.Name+":"+s.Labels["team"])
			}
			if want := []string{"s-2:b", "s-3:b"}; !slices.Equal(left, want) {
				t.Errorf("Students in %s after uninstalling team-a: %v, want %v", ns, left, want)
			}
		}
		rows := rowsOf(t, u.db)
		for uid, policy := range u.uids {
			row, ok := rows[uid]
			if policy == studentv1.DeletionPolicyDelete && ok || policy == studentv1.DeletionPolicyOrphan && (!ok || row.Owner != "") {
				t.Errorf("row %s (%s) after the uninstall: %+v (there: %v)", uid, policy, row, ok)
			}
		}
	})

	// The same with kustomize, one installation patched to watch school-a: the CRD stays
	// for school-b's Students (config/default holds the CRD, and deleting it would take
	// every Student with it), and so does config/registry's claim with its rows.
	t.Run("kustomize, one namespace", func(t *testing.T) {
		t.Parallel()
		u := newUninstallCluster(t)
		overlay := u.overlay(t, "--namespace=school-a")
		for _, dir := range []string{filepath.Join(u.cp.Root, "config", "registry"), overlay} {
			if out, err := exec.Command("kubectl", "--kubeconfig", u.cp.Kubeconfig, "apply", "-k", dir).CombinedOutput(); err != nil {
				t.Fatalf("kubectl apply -k %s: %v\n%s", dir, err, out)
			}
		}
		for _, team := range []string{"a", "b"} {
			startProcess(t, "controller-"+team, "--kubeconfig", u.cp.Kubeconfig, "--registry", "sqlite://"+u.registry,
				"--registry-owner", "team-"+team, "--namespace", "school-"+team)
		}
		u.populate(t)
		out, err := u.uninstall("2m", "kustomize", overlay)
		if err != nil {
			t.Fatalf("hack/uninstall.sh kustomize: %v\n%s", err, out)
		}
		ctx := context.Background()
		for ns, want := range map[string]int{"school-a": 0, "school-b": 5} {
			list, err := u.students.BolingcavalryV1().Students(ns).List(ctx, metav1.ListOptions{})
			if err != nil || len(list.Items) != want {
				t.Errorf("Students in %s after the uninstall: %d, %v; want %d\n%s", ns, len(list.Items), err, want, out)
			}
		}
		if _, err := u.kube.CoreV1().PersistentVolumeClaims("student-controller-system").Get(ctx, "student-controller-registry", metav1.GetOptions{}); err != nil {
			t.Errorf("the registry's claim after the uninstall: %v", err)
		}
		if _, err := u.kube.AppsV1().Deployments("student-controller-system").Get(ctx, "student-controller", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("the Deployment after the uninstall: %v", err)
		}
	})

	// An operator who deletes what config/default installed, by hand, while its
	// controller still runs (its grace period): the CRD (config/crd), every Student, the
	// registry's claim and the namespace it lives in (config/registry) stay, rows and
	// all. Installed again, the controller finds every row as it was. The CRD deleted
	// by hand then releases every row; applied again, a Delete Student's deletion
	// deletes its row again.
	t.Run("kubectl delete -k config/default keeps the CRD, the Students and the registry", func(t *testing.T) {
		t.Parallel()
		u := newUninstallCluster(t)
		kubectl := func(args ...string) {
			t.Helper()
			if out, err := exec.Command("kubectl", append([]string{"--kubeconfig", u.cp.Kubeconfig}, args...)...).CombinedOutput(); err != nil { // #nosec G204 -- kubectl with the test's arguments
				t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
			}
		}
		for _, dir := range []string{"crd", "registry", "default"} {
			kubectl("apply", "-k", filepath.Join(u.cp.Root, "config", dir))
		}
		// The Deployment's controller, as its Pod would run it (no kubelet here).
		ctrl := startProcess(t, "controller", u.args...)
		u.populate(t)
		before := rowsOf(t, u.db)
		kubectl("delete", "-k", filepath.Join(u.cp.Root, "config", "default"), "--wait", "--timeout=2m")
		ctx := context.Background()
		list, err := u.students.BolingcavalryV1().Students("").List(ctx, metav1.ListOptions{})
		if err != nil || len(list.Items) != 10 {
			t.Fatalf("Students after kubectl delete -k config/default: %d, %v; want all 10", len(list.Items), err)
		}
		for _, s := range list.Items {
			if s.DeletionTimestamp != nil {
				t.Errorf("Student %s/%s is being deleted", s.Namespace, s.Name)
			}
		}
		if _, err := u.kube.AppsV1().Deployments(controlplane.ControllerNamespace).Get(ctx, "student-controller", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("the Deployment after kubectl delete -k config/default: %v, want it gone", err)
		}
		claim, err := u.kube.CoreV1().PersistentVolumeClaims(controlplane.ControllerNamespace).Get(ctx, "student-controller-registry", metav1.GetOptions{})
		if err != nil || claim.DeletionTimestamp != nil {
			t.Errorf("the registry's claim after kubectl delete -k config/default: %v (deleting: %v), want it kept", err, claim.DeletionTimestamp != nil)
		}
		ns, err := u.kube.CoreV1().Namespaces().Get(ctx, controlplane.ControllerNamespace, metav1.GetOptions{})
		if err != nil || ns.DeletionTimestamp != nil {
			t.Errorf("the claim's namespace after kubectl delete -k config/default: %v, want it kept", err)
		}
		ctrl.signal(syscall.SIGTERM)
		if err := ctrl.wait(45 * time.Second); err != nil {
			t.Errorf("the controller's exit: %v", err)
		}
		kubectl("apply", "-k", filepath.Join(u.cp.Root, "config", "default"))
		startProcess(t, "controller-again", u.args...)
		for _, ns := range []string{"school-a", "school-b"} {
			waitAllReadyIn(t, u.students.BolingcavalryV1().Students(ns), 5, time.Minute)
		}
		if diff := cmp.Diff(before, rowsOf(t, u.db)); diff != "" || len(before) != 10 {
			t.Errorf("rows after the uninstall and the install again (-before +after), %d before:\n%s", len(before), diff)
		}

		// Deleting the CRD by hand, the controller running, deletes every Student; no
		// user deleted them, so every row is kept, released.
		kubectl("delete", "crd", "students.bolingcavalry.k8s.io", "--wait", "--timeout=2m")
		rows := rowsOf(t, u.db)
		for uid, policy := range u.uids {
			if row, ok := rows[uid]; !ok || row.Owner != "" {
				t.Errorf("row %s (%s) after the CRD's deletion: %+v (there: %v); want it kept, released", uid, policy, row, ok)
			}
		}
		var prunable int
		if err := u.db.QueryRow(`SELECT count(*) FROM students WHERE release_cause = 'crd-deleted' AND deletion_policy = 'Delete'`).Scan(&prunable); err != nil || prunable != 6 {
			t.Errorf("rows released for the CRD's deletion with policy Delete: %d, %v; want the 6 Delete ones", prunable, err)
		}

		// The CRD applied again, the same controller running: a user's deletion of a
		// Delete Student deletes its row again, not released as for the CRD.
		kubectl("apply", "-k", filepath.Join(u.cp.Root, "config", "crd"))
		client := u.students.BolingcavalryV1().Students("school-a")
		eventually(t, time.Minute, "the CRD served again", func(ctx context.Context) (bool, error) {
			_, err := client.Create(ctx, newStudent("after-crd", "school A", studentv1.DeletionPolicyDelete), metav1.CreateOptions{})
			return err == nil, nil
		})
		var uid string
		eventually(t, time.Minute, "the new Student Ready, its row written", func(ctx context.Context) (bool, error) {
			s, err := client.Get(ctx, "after-crd", metav1.GetOptions{})
			if err != nil || !isReady(s) {
				return false, nil
			}
			uid = string(s.UID)
			_, ok := rowsOf(t, u.db)[uid]
			return ok, nil
		})
		if err := client.Delete(context.Background(), "after-crd", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, time.Minute, "its row deleted with it", func(ctx context.Context) (bool, error) {
			_, err := client.Get(ctx, "after-crd", metav1.GetOptions{})
			_, there := rowsOf(t, u.db)[uid]
			return apierrors.IsNotFound(err) && !there, nil
		})
	})

	t.Run("controller gone", func(t *testing.T) {
		t.Parallel()
		u := newUninstallCluster(t)
		ctrl := startProcess(t, "controller", u.args...)
		u.populate(t)
		ctrl.signal(syscall.SIGKILL)
		_ = ctrl.wait(10 * time.Second)

		// What a careless uninstall leaves: Students and the namespaces that hold them
		// Terminating, held by the finalizer of a controller that is gone.
		ctx := context.Background()
		if err := u.kube.CoreV1().Namespaces().Delete(ctx, "school-b", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		out, err := u.uninstall("10s")
		if err == nil || !strings.Contains(out, "Is it running?") {
			t.Fatalf("hack/uninstall.sh without a controller: %v, want a failure that says why:\n%s", err, out)
		}
		list, err := u.students.BolingcavalryV1().Students("").List(ctx, metav1.ListOptions{})
		if err != nil || len(list.Items) != 10 {
			t.Fatalf("Students after the failed uninstall: %d, %v; want all 10, Terminating", len(list.Items), err)
		}
		for _, s := range list.Items {
			if s.DeletionTimestamp == nil {
				t.Errorf("%s/%s not Terminating", s.Namespace, s.Name)
			}
		}

		// The way out: the controller again, with the same registry and owner.
		startProcess(t, "controller-again", u.args...)
		if out, err := u.uninstall("2m"); err != nil {
			t.Fatalf("hack/uninstall.sh with the controller back: %v\n%s", err, out)
		}
		u.assertNothingLeft(t)
	})
}
