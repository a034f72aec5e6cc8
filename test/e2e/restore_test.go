package e2e

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/student-controller/student-controller/internal/testenv"
	"github.com/student-controller/student-controller/internal/testenv/controlplane"
	"github.com/student-controller/student-controller/internal/testenv/ctrlbin"
	"github.com/student-controller/student-controller/internal/testenv/pgtest"
	"github.com/student-controller/student-controller/internal/testenv/registrytest"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
	"github.com/student-controller/student-controller/pkg/generated/clientset/versioned"
	studentclient "github.com/student-controller/student-controller/pkg/generated/clientset/versioned/typed/bolingcavalry/v1"
)

// TestEtcdRestore: etcd is restored in place from a copy of its data taken before
// three spec changes that the rows already hold. The Students went back to
// generation 1; the registry has seen generation 4. The cluster is the desired state:
// after the restart the rows follow the Students (a RegistryAhead Event says why), the
// deletion of an Orphan Student finishes with its row released, a spec change after
// the restore reaches its row, and a Delete Student's deletion deletes it. Two Students
// deleted after the copy are live again after the restore: the Orphan one takes back
// the row its deletion released (RowTakenBack), the Delete one has its row written
// again (RowRecreated), both within --registry-max-rewinds.
func TestEtcdRestore(t *testing.T) {
	t.Parallel() // a control plane of its own
	ctx := context.Background()
	cp := controlplane.ForTest(t, controlplane.Options{WithoutControllerManager: true})
	kube := kubernetes.NewForConfigOrDie(cp.Config)
	const ns = "restore"
	if err := testenv.EnsureNamespace(ctx, kube, ns); err != nil {
		t.Fatal(err)
	}
	client := versioned.NewForConfigOrDie(cp.Config).BolingcavalryV1().Students(ns)
	path := filepath.Join(t.TempDir(), "registry.db")
	db := registrytest.OpenSQLite(t, path)
	args := []string{"--kubeconfig", cp.Kubeconfig, "--registry", "sqlite://" + path, "--registry-owner", owner, "--sweep-interval", "2s"}
	ctrl := startProcess(t, "controller", args...)

	uids := createAll(t, client, map[string]studentv1.DeletionPolicy{"r1": studentv1.DeletionPolicyOrphan, "r2": studentv1.DeletionPolicyDelete,
		"r3": studentv1.DeletionPolicyOrphan, "r4": studentv1.DeletionPolicyDelete})
	waitAllReadyIn(t, client, 4, time.Minute)

	// The backup: etcd's data, copied while etcd is stopped.
	backup := filepath.Join(t.TempDir(), "etcd")
	stopControlPlane(t, cp)
	copyDir(t, filepath.Join(cp.Dir, "etcd"), backup)
	startControlPlane(t, cp)

	for _, school := range []string{"school B", "school C", "school D"} {
		setSchool(t, client, "r1", school)
		setSchool(t, client, "r2", school)
	}
	for _, name := range []string{"r3", "r4"} {
		if err := client.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitAllReadyIn(t, client, 2, time.Minute)
	waitRows(t, db, "the rows at school D, generation 4; r3's released, r4's deleted", func(rows map[string]row) bool {
		_, r4 := rows[uids["r4"]]
		return rows[uids["r1"]] == row{owner, "school D", 4} && rows[uids["r2"]] == row{owner, "school D", 4} &&
			rows[uids["r3"]] == row{"", "school A", 2} && !r4 // a deletion is a new generation
	})

	// The restore: the controller stopped, etcd's data put back, everything started.
	if err := ctrl.Kill(); err != nil {
		t.Fatal(err)
	}
	stopControlPlane(t, cp)
	if err := os.RemoveAll(filepath.Join(cp.Dir, "etcd")); err != nil {
		t.Fatal(err)
	}
	copyDir(t, backup, filepath.Join(cp.Dir, "etcd"))
	startControlPlane(t, cp)
	for name := range uids {
		if s, err := client.Get(ctx, name, metav1.GetOptions{}); err != nil || s.Spec.School != "school A" || s.Generation != 1 {
			t.Fatalf("after the restore, Student %s: %v, %+v; want school A at generation 1", name, err, s)
		}
	}
	// The Orphan Student is deleted before the controller is back: its release finds
	// the row ahead.
	if err := client.Delete(ctx, "r1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// Marking it deleted is a new generation of it (2, still behind the row's 4).
	terminating, err := client.Get(ctx, "r1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	startProcess(t, "controller-after-restore", args...)

	// The restart does not trust the status (Ready at generation 1 all along), and the
	// deletion finishes with the row released at the Student's last spec.
	waitRows(t, db, "r1's row released and r2's back at school A, generation 1", func(rows map[string]row) bool {
		return rows[uids["r1"]] == row{"", "school A", terminating.Generation} && rows[uids["r2"]] == row{owner, "school A", 1}
	})
	eventually(t, 30*time.Second, "r1 gone, and a RegistryAhead Event on r2", func(ctx context.Context) (bool, error) {
		if _, err := client.Get(ctx, "r1", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return false, nil
		}
		list, err := kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=r2,reason=RegistryAhead"})
		return err == nil && len(list.Items) > 0, err
	})
	// The Students deleted after the copy are back: their rows with them, Ready.
	waitRows(t, db, "r3's row taken back, r4's written again", func(rows map[string]row) bool {
		return rows[uids["r3"]] == row{owner, "school A", 1} && rows[uids["r4"]] == row{owner, "school A", 1}
	})
	eventually(t, 30*time.Second, "RowTakenBack on r3, RowRecreated on r4, both Ready", func(ctx context.Context) (bool, error) {
		for name, reason := range map[string]string{"r3": "RowTakenBack", "r4": "RowRecreated"} {
			list, err := kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name + ",reason=" + reason})
			if err != nil || len(list.Items) == 0 {
				return false, err
			}
			s, err := client.Get(ctx, name, metav1.GetOptions{})
			if err != nil || !isReady(s) {
				return false, err
			}
		}
		return true, nil
	})

	// A spec change after the restore (generation 2, behind the row's 4 before) reaches
	// the row; the deletion of the Delete Student deletes it.
	setSchool(t, client, "r2", "school E")
	waitRows(t, db, "r2's row at school E, generation 2", func(rows map[string]row) bool {
		return rows[uids["r2"]] == row{owner, "school E", 2}
	})
	if err := client.Delete(ctx, "r2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRows(t, db, "r2's row deleted, r1's kept", func(rows map[string]row) bool {
		_, ok := rows[uids["r2"]]
		return !ok && rows[uids["r1"]] == row{"", "school A", terminating.Generation}
	})
}

// createAll creates a Student at school A for each name, with its deletion policy,
// and returns their UIDs by name.
func createAll(t *testing.T, client studentclient.StudentInterface, policies map[string]studentv1.DeletionPolicy) map[string]string {
	t.Helper()
	uids := map[string]string{}
	for name, policy := range policies {
		s, err := client.Create(context.Background(), newStudent(name, "school A", policy), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		uids[name] = string(s.UID)
	}
	return uids
}

// row is what TestEtcdRestore checks of a registry row.
type row struct {
	owner, school string
	generation    int64
}

// sqliteRows reads the rows of a registry file, by UID.
func sqliteRows(t *testing.T, db *sql.DB) map[string]row {
	t.Helper()
	out := map[string]row{}
	for uid, r := range rowsOf(t, db) {
		out[uid] = row{r.Owner, r.School, r.Generation}
	}
	return out
}

// waitRows waits until the registry's rows satisfy ok.
func waitRows(t *testing.T, db *sql.DB, what string, ok func(map[string]row) bool) {
	t.Helper()
	var last map[string]row
	eventually(t, time.Minute, what, func(context.Context) (bool, error) {
		last = sqliteRows(t, db)
		return ok(last), nil
	})
}

// setSchool changes a Student's school: a new generation.
func setSchool(t *testing.T, client studentclient.StudentInterface, name, school string) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s, err := client.Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		s.Spec.School = school
		_, err = client.Update(context.Background(), s, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// stopControlPlane stops kube-apiserver, then etcd.
func stopControlPlane(t *testing.T, cp *controlplane.Env) {
	t.Helper()
	if err := cp.APIServer.Stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := cp.Etcd.Stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}
}

// startControlPlane starts etcd, then kube-apiserver, on the data etcd's folder holds.
func startControlPlane(t *testing.T, cp *controlplane.Env) {
	t.Helper()
	if err := cp.StartEtcd(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := cp.StartAPIServer(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// copyDir copies the folder from to a new folder to, as a backup of etcd's data
// is taken and put back: owner-only, as etcd wants its data.
func copyDir(t *testing.T, from, to string) {
	t.Helper()
	err := filepath.WalkDir(from, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(from, path)
		if err != nil {
			return err
		}
		target := filepath.Join(to, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o700)
		}
		b, err := os.ReadFile(path) // #nosec G304 -- the test's own etcd data
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestBackupDrill: a backup taken while the controller writes (`registry backup` on
// SQLite, pg_dump on PostgreSQL), then restored once the cluster has moved on: a
// Student changed, three deleted (one of them switched from Delete to Orphan first),
// one created. With the controller stopped the backup is put back, and the controller
// started again. It finds the registry behind the mark the cluster keeps: not ready,
// the metric at 1, the live Students' rows written back as their Students are (the
// row that did not change is not written), and nothing released or pruned on the
// older backup's word. Once an operator confirms, the rows of the Students deleted
// since are released and kept, whatever policy the backup says; registry adopt,
// which would make them again, refuses before that. registry prune lists
// the Delete ones, refuses to delete while the controller holds the owner's fence,
// and deletes them once it is stopped.
func TestBackupDrill(t *testing.T) {
	t.Parallel()
	registrytest.ForEach(t, pg, testBackupDrill)
}

func testBackupDrill(t *testing.T, b registrytest.Backend) {
	ctx := context.Background()
	ns := testenv.Namespace(t, kubeClient(), "e2e-")
	client := students(ns)
	url, db := b.New(t)
	procURL, passwordArgs := registrytest.ForProcess(t, url)
	common := append([]string{"--kubeconfig", controllerID.Kubeconfig, "--registry", procURL, "--registry-owner", owner}, passwordArgs...)
	common = append(common, "--registry-mark-namespace", ns)
	markRBAC(t, ns, "student-controller-registry-mark")
	args := append([]string{"--namespace", ns, "--sweep-interval", "2s"}, common...)
	ctrl := startProcess(t, "controller", args...)
	uids := createAll(t, client, map[string]studentv1.DeletionPolicy{"kept": "Delete", "changed": "Delete", "gone-delete": "Delete",
		"gone-orphan": "Orphan", "switched": "Delete"})
	waitAllReady(t, ns, 5, time.Minute)

	backup := filepath.Join(t.TempDir(), "backup")
	var path string
	if b.Name == "sqlite" {
		path = strings.TrimPrefix(url, "sqlite://")
		out, err := exec.Command(ctrlbin.Binary(t), "registry", "backup", "--registry", url, "--to", backup).CombinedOutput() // #nosec G204 -- the controller built for the test
		if err != nil || !strings.Contains(string(out), "(5 rows, 5 history rows)") {
			t.Fatalf("registry backup: %v\n%s", err, out)
		}
	} else {
		pgTool(t, "pg_dump", "--format=custom", "--file="+backup, "--dbname="+url)
	}
	keptWritten := updatedAt(t, db, uids["kept"])
	// The cluster's mark passes the backup's before the restore.
	var backupMark int64
	if err := db.QueryRow(`SELECT mark FROM fences WHERE owner = $1`, owner).Scan(&backupMark); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the cluster's mark to pass the backup's", func() bool { return clusterMark(t, ns) > backupMark })

	// The cluster moves on.
	setSchool(t, client, "changed", "school B")
	setPolicy(t, client, "switched", studentv1.DeletionPolicyOrphan)
	waitAllReady(t, ns, 5, time.Minute)
	for _, name := range []string{"gone-delete", "gone-orphan", "switched"} {
		if err := client.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	created, err := client.Create(ctx, newStudent("created", "school A", ""), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	uids["created"] = string(created.UID)
	waitAllReady(t, ns, 3, time.Minute)

	// The restore.
	ctrl.signal(syscall.SIGTERM)
	if err := ctrl.wait(45 * time.Second); err != nil {
		t.Fatalf("the controller's exit: %v", err)
	}
	if b.Name == "sqlite" {
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{path + "-wal", path + "-shm"} {
			if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Fatal(err)
			}
		}
		copyFile(t, backup, path)
		db = registrytest.OpenSQLite(t, path)
	} else {
		pgTool(t, "pg_restore", "--clean", "--if-exists", "--single-transaction", "--dbname="+url, backup)
	}
	// adopt would make Students again of the rows the backup holds for the three
	// deleted since: it refuses until the operator confirms the registry, even to
	// plan (the backup's fence is still held, so --dry-run).
	operator := append([]string{"registry", "adopt", "--dry-run", "--namespace", ns, "--kubeconfig", env.Kubeconfig}, common[2:]...)
	adopt := exec.Command(ctrlbin.Binary(t), operator...) // #nosec G204 -- the controller built for the test
	if out, err := adopt.CombinedOutput(); adopt.ProcessState.ExitCode() != 1 || !strings.Contains(string(out), "below the") {
		t.Errorf("registry adopt on the registry put back: %v; want exit 1, naming both marks:\n%s", err, out)
	}
	if list, err := client.List(ctx, metav1.ListOptions{}); err != nil || len(list.Items) != 3 {
		t.Errorf("Students after the refused adopt: %d, %v; want the 3 live ones", len(list.Items), err)
	}
	// plan plans as the controller would on it: no row let go, and it says why.
	planCmd := exec.Command(ctrlbin.Binary(t), append([]string{"plan", "-o", "json", "--namespace", ns, "--kubeconfig", env.Kubeconfig}, common[2:]...)...) // #nosec G204 -- the controller built for the test
	planOut, _ := planCmd.Output()
	var plan struct {
		RegistryBehind string
		Actions        []struct{ Action, Name, Cause string }
	}
	if err := json.Unmarshal(planOut, &plan); err != nil || !strings.Contains(plan.RegistryBehind, "below the") {
		t.Errorf("plan on the registry put back: %v; want it to say the registry is behind:\n%s", err, planOut)
	}
	for _, a := range plan.Actions {
		if strings.HasPrefix(a.Name, "gone-") || a.Name == "switched" {
			if a.Action != "refuse" {
				t.Errorf("plan on the registry put back: %s %s (%s); want refuse: the registry is behind", a.Action, a.Name, a.Cause)
			}
		}
	}
	ctrl = startProcess(t, "controller-after-restore", args...)

	// Behind: live rows written back, nothing released, not ready, prune refused.
	asBackedUp := row{owner, "school A", 1}
	waitRows(t, db, "the live Students' rows written back, the deleted ones' left as the backup has them", func(rows map[string]row) bool {
		return len(rows) == 6 &&
			rows[uids["kept"]] == asBackedUp && rows[uids["changed"]] == row{owner, "school B", 2} &&
			rows[uids["created"]] == asBackedUp &&
			rows[uids["gone-delete"]] == asBackedUp && rows[uids["gone-orphan"]] == asBackedUp && rows[uids["switched"]] == asBackedUp
	})
	waitFor(t, time.Minute, "a sweep refused while the registry is behind", func() bool {
		_, body, err := get("http://" + ctrl.MetricsAddr + "/metrics")
		return err == nil && testenv.MetricSum(body, "student_controller_registry_behind", nil) == 1 &&
			testenv.MetricSum(body, "student_controller_sweep_total", func(l string) bool { return l == `outcome="refused"` }) >= 1
	})
	if code, body, _ := get("http://" + ctrl.ProbeAddr + "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "went back in time") {
		t.Errorf("/readyz while the registry is behind: %d %q; want 503 saying the registry went back in time", code, body)
	}
	if rows := sqliteRows(t, db); rows[uids["gone-orphan"]] != asBackedUp || rows[uids["switched"]] != asBackedUp {
		t.Errorf("rows of deleted Students after a refused sweep: %v; want them as the backup has them", rows)
	}
	prune := func(extra ...string) (string, int) {
		cmd := exec.Command(ctrlbin.Binary(t), append(append([]string{"registry", "prune", "--namespace", ns}, common...), extra...)...) // #nosec G204 -- the controller built for the test
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			t.Fatal(err)
		}
		return string(out), cmd.ProcessState.ExitCode()
	}
	if out, code := prune(); code != 1 || !strings.Contains(out, "below the") {
		t.Errorf("registry prune while the registry is behind: exit %d; want 1, naming both marks:\n%s", code, out)
	}

	// The operator confirms the registry as it is.
	confirm := exec.Command(ctrlbin.Binary(t), append([]string{"registry", "confirm-restore"}, common...)...) // #nosec G204 -- the controller built for the test
	if out, err := confirm.CombinedOutput(); err != nil || !strings.Contains(string(out), "confirmed the registry as it is") {
		t.Fatalf("registry confirm-restore: %v\n%s", err, out)
	}

	released := row{"", "school A", 1}
	waitRows(t, db, "the rows as the Students are, the deleted ones' kept and released", func(rows map[string]row) bool {
		return len(rows) == 6 &&
			rows[uids["kept"]] == row{owner, "school A", 1} &&
			rows[uids["changed"]] == row{owner, "school B", 2} &&
			rows[uids["created"]] == row{owner, "school A", 1} &&
			rows[uids["gone-delete"]] == released && rows[uids["gone-orphan"]] == released && rows[uids["switched"]] == released
	})
	if got := updatedAt(t, db, uids["kept"]); got != keptWritten {
		t.Errorf("the row that did not change was written: updated_at %s, was %s", got, keptWritten)
	}
	waitAllReady(t, ns, 3, time.Minute)
	waitFor(t, time.Minute, "/readyz once confirmed", func() bool {
		code, _, _ := get("http://" + ctrl.ProbeAddr + "/readyz")
		return code == http.StatusOK
	})

	// prune: the two rows the backup says Delete, listed; refused while the controller
	// holds the fence; deleted once it is stopped.
	out, code := prune()
	if code != 2 || !strings.Contains(out, uids["gone-delete"]) || !strings.Contains(out, uids["switched"]) || strings.Contains(out, uids["gone-orphan"]) {
		t.Errorf("registry prune: exit %d; want 2, listing gone-delete and switched alone:\n%s", code, out)
	}
	if out, code := prune("--yes"); code != 1 || !strings.Contains(out, "held by") {
		t.Errorf("registry prune --yes while the controller runs: exit %d; want 1, naming the fence's holder:\n%s", code, out)
	}
	if rows := sqliteRows(t, db); len(rows) != 6 {
		t.Errorf("rows after the refused prune: %d, want 6", len(rows))
	}
	ctrl.signal(syscall.SIGTERM)
	if err := ctrl.wait(45 * time.Second); err != nil {
		t.Fatalf("the controller's exit: %v", err)
	}
	if out, code := prune("--yes"); code != 0 || !strings.Contains(out, "pruned 2 of 2") {
		t.Errorf("registry prune --yes: exit %d; want 0, 2 pruned:\n%s", code, out)
	}
	rows := sqliteRows(t, db)
	_, goneDelete := rows[uids["gone-delete"]]
	_, switched := rows[uids["switched"]]
	if len(rows) != 4 || goneDelete || switched || rows[uids["gone-orphan"]] != released {
		t.Errorf("rows after prune: %v; want the two pruned gone, the Orphan one kept", rows)
	}
}

// pgTool runs one of PostgreSQL's client programs (pg_dump, pg_restore).
func pgTool(t *testing.T, name string, args ...string) {
	t.Helper()
	out, err := exec.Command(filepath.Join(pgtest.BinDir(), name), args...).CombinedOutput() // #nosec G204 -- the test's own arguments
	if err != nil {
		t.Fatalf("%s: %v\n%s", name, err, out)
	}
}

// setPolicy changes a Student's deletion policy: a new generation.
func setPolicy(t *testing.T, client studentclient.StudentInterface, name string, policy studentv1.DeletionPolicy) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s, err := client.Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		s.Spec.DeletionPolicy = policy
		_, err = client.Update(context.Background(), s, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// updatedAt reads a row's updated_at as the registry stores it.
func updatedAt(t *testing.T, db *sql.DB, uid string) string {
	t.Helper()
	var at string
	if err := db.QueryRow(`SELECT updated_at FROM students WHERE uid = $1`, uid).Scan(&at); err != nil {
		t.Fatal(err)
	}
	return at
}

// copyFile copies the file from to the path to, as an operator puts a backup back.
func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from) // #nosec G304 -- the test's own backup
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// markRBAC lets the controller's ServiceAccount keep the registry's mark in the
// ConfigMap name of namespace ns, as config/rbac's leader election Role does in the
// controller's namespace.
func markRBAC(t *testing.T, ns, name string) {
	t.Helper()
	ctx := context.Background()
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "registry-mark", Namespace: ns},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"create"}},
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{name}, Verbs: []string{"get", "update"}},
		},
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "registry-mark", Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: serviceAccount, Namespace: systemNamespace}},
	}
	if _, err := kubeClient().RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kubeClient().RbacV1().RoleBindings(ns).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// clusterMark is the registry's mark that the cluster keeps in namespace ns; 0 while
// there is none.
func clusterMark(t *testing.T, ns string) int64 {
	t.Helper()
	cm, err := kubeClient().CoreV1().ConfigMaps(ns).Get(context.Background(), "student-controller-registry-mark", metav1.GetOptions{})
	if err != nil {
		return 0
	}
	mark, _ := strconv.ParseInt(cm.Data["mark"], 10, 64)
	return mark
}
