package node

import (
	"context"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/student-controller/student-controller/internal/testenv"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

const systemNamespace = "student-controller-system"

// TestHelmInstall: `helm install` from a registry, by the chart's version (the chart's
// folder packaged at VERSION and pushed to the node's loopback registry with helm
// push, as make publish pushes make release's), with the chart's default values but
// the image's digest, which the node pulls from that registry as a cluster does, runs the controller under the restricted Pod
// Security Standard; it reaches the API server through in-cluster config and writes
// each Student's row to the SQLite file on its claim. Deleting the Pod loses no row
// (a released Orphan row included) and the new Pod writes none again. hack/uninstall.sh
// then leaves nothing Terminating.
func TestHelmInstall(t *testing.T) {
	cleanupInstall(t, "helm", "student-controller", systemNamespace)
	restrictedNamespace(t, systemNamespace)
	chart := publishChart(t)
	// The chart renders the CRD; the control plane may have installed it already.
	out := run(t, "helm", "install", "student-controller", chart.ref, "--version", chart.version, "--plain-http",
		"--namespace", systemNamespace, "--take-ownership", "--set", "image.repository="+image.repository, "--set", "image.digest="+image.digest)
	// The chart's notes say where the registry is.
	if !strings.Contains(out, "a SQLite file on the claim student-controller-registry") {
		t.Errorf("helm install's notes do not say the registry is on the claim:\n%s", out)
	}
	checkInstall(t, "student-controller-registry")
	checkMetricsAccess(t)
	// kubectl logs: the API server reaches the kubelet, which reads the container's log.
	if out := run(t, "kubectl", "-n", systemNamespace, "logs", "deploy/student-controller"); !strings.Contains(out, "Started workers") {
		t.Errorf("kubectl logs deploy/student-controller: no \"Started workers\" in\n%s", out)
	}
	out = run(t, "uninstall", "--yes", "helm", "student-controller", systemNamespace)
	assertUninstalled(t, out)
}

// TestKustomizeInstall: the same with `kubectl apply -k config/registry` (the namespace
// and the claim) and `kubectl apply -k config/default`, its image set the way
// docs/install.md says (kustomize edit set image).
func TestKustomizeInstall(t *testing.T) {
	dir := overlay(t, "config/default", "")
	cleanupInstall(t, "kustomize", dir)
	run(t, "kubectl", "apply", "-k", "config/crd")
	run(t, "kubectl", "apply", "-k", "config/registry")
	run(t, "kubectl", "apply", "-k", dir)
	// config/registry's namespace enforces restricted Pod Security itself.
	ns, err := kube.CoreV1().Namespaces().Get(context.Background(), systemNamespace, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := ns.Labels["pod-security.kubernetes.io/enforce"]; got != "restricted" {
		t.Errorf("namespace %s enforces Pod Security %q, want restricted", systemNamespace, got)
	}
	checkInstall(t, "student-controller-registry")
	out := run(t, "uninstall", "--yes", "kustomize", dir)
	assertUninstalled(t, out)
}

// checkMetricsAccess: Prometheus' view of /metrics through the Service. A token bound
// to the metrics-reader ClusterRole reads it; no token, or a token without the role,
// is refused.
func checkMetricsAccess(t *testing.T) {
	t.Helper()
	// The Service reaches a Pod once kube-proxy has heard of its endpoint, a moment after
	// the Pod is Ready: checkInstall has just replaced the Pod. Until then a connection
	// fails (code 0, "no route to host"); what answers is checked.
	token := scraper(t)
	code, body := scrape(t, token)
	for deadline := time.Now().Add(30 * time.Second); code == 0 && time.Now().Before(deadline); {
		time.Sleep(500 * time.Millisecond)
		code, body = scrape(t, token)
	}
	if code != http.StatusOK || !strings.Contains(body, "student_controller_") {
		t.Errorf("/metrics with the metrics-reader's token: %d, want 200 and the controller's metrics:\n%.300s", code, body)
	}
	if code, body := scrape(t, ""); code != http.StatusUnauthorized {
		t.Errorf("/metrics without a token: %d, want 401:\n%.300s", code, body)
	}
	id, err := cp.ServiceAccount(context.Background(), "monitoring", "not-a-reader")
	if err != nil {
		t.Fatal(err)
	}
	if code, body := scrape(t, id.Config.BearerToken); code != http.StatusForbidden {
		t.Errorf("/metrics with a token not bound to the metrics-reader role: %d, want 403:\n%.300s", code, body)
	}
}

// checkInstall checks an install with the SQLite registry on the claim named claim.
func checkInstall(t *testing.T, claim string) {
	t.Helper()
	ctx := context.Background()
	pods := readyPods(t, systemNamespace, 1, 3*time.Minute)
	ns := "node-" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))
	studentNamespace(t, ns)
	diagnose := func() string { return describe(systemNamespace) }
	kept := newStudent(t, ns, "kept", studentv1.DeletionPolicyOrphan)
	ada := newStudent(t, ns, "ada", studentv1.DeletionPolicyDelete)
	waitReady(t, ns, "kept", diagnose)
	waitReady(t, ns, "ada", diagnose)

	db := registryFile(t, claim)
	rows := sqliteRows(t, db)
	for _, s := range []*studentv1.Student{kept, ada} {
		row, ok := rows[string(s.UID)]
		if !ok || row.studentName != s.Spec.Name || row.school != s.Spec.School || row.owner == "" || row.policy != string(s.Spec.DeletionPolicy) {
			t.Errorf("the row of %s/%s: %+v (found: %v), want name %q, school %q, owned, policy %s",
				s.Namespace, s.Name, row, ok, s.Spec.Name, s.Spec.School, s.Spec.DeletionPolicy)
		}
	}
	// The Orphan Student goes: its row stays, released.
	if err := stu.BolingcavalryV1().Students(ns).Delete(ctx, "kept", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "Student kept deleted", func(ctx context.Context) (bool, error) {
		_, err := stu.BolingcavalryV1().Students(ns).Get(ctx, "kept", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}, diagnose)
	before := sqliteRows(t, db)
	if row := before[string(kept.UID)]; row.owner != "" || row.releasedAt == "" {
		t.Fatalf("the Orphan row after its Student went: %+v, want it kept and released", row)
	}

	// The Pod goes; the Deployment makes another, which opens the same file.
	if err := kube.CoreV1().Pods(systemNamespace).Delete(ctx, pods[0].Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var newPod corev1.Pod
	eventually(t, 3*time.Minute, "a new controller Pod Ready", func(ctx context.Context) (bool, error) {
		p := readyPodsNow(ctx)
		if len(p) != 1 || p[0].Name == pods[0].Name {
			return false, nil
		}
		newPod = p[0]
		return true, nil
	}, diagnose)
	// Its sweep found every row as it should be, it wrote none, and the rows are as
	// they were: none lost, none written again. Asked of the new Pod itself: the old
	// one answers through the Service until kube-proxy drops it (its counters made CI
	// fail once).
	clean, metrics := waitSweptClean(t, &newPod)
	if !clean {
		t.Fatalf("the new Pod's sweep did not find the registry clean; its metrics:\n%s\n%s", grepMetrics(metrics), diagnose())
	}
	if written := testenv.MetricSum(metrics, "student_controller_registry_rows_written_total", nil); written != 0 {
		t.Errorf("the new Pod wrote %v rows, want none:\n%s", written, grepMetrics(metrics))
	}
	after := sqliteRows(t, db)
	if !maps.Equal(before, after) {
		t.Errorf("the rows changed across the Pod's restart:\nbefore %+v\nafter  %+v", before, after)
	}
	// And it works: a change to a Student reaches its row.
	s, err := stu.BolingcavalryV1().Students(ns).Get(ctx, "ada", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Spec.School = "Moved School"
	if _, err := stu.BolingcavalryV1().Students(ns).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitReady(t, ns, "ada", diagnose)
	if row := sqliteRows(t, db)[string(ada.UID)]; row.school != "Moved School" {
		t.Errorf("the new Pod did not write the changed school: %+v", row)
	}
}

// grepMetrics keeps the controller's own lines of a scrape.
func grepMetrics(body string) string {
	var keep []string
	for line := range strings.Lines(body) {
		if strings.HasPrefix(line, "student_controller_sweep_total") || strings.HasPrefix(line, "student_controller_registry_rows_written_total") {
			keep = append(keep, strings.TrimSpace(line))
		}
	}
	return strings.Join(keep, "\n")
}

// assertUninstalled checks hack/uninstall.sh's end: no Student, no CRD, nothing
// Terminating, no controller Pod.
func assertUninstalled(t *testing.T, out string) {
	t.Helper()
	eventually(t, 2*time.Minute, "nothing left Terminating after hack/uninstall.sh", func(ctx context.Context) (bool, error) {
		nss, err := kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, ns := range nss.Items {
			if ns.DeletionTimestamp != nil {
				return false, nil
			}
		}
		// Every Pod of the controller gone, Terminating ones included.
		pods, err := kube.CoreV1().Pods(systemNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=student-controller"})
		if err != nil {
			return false, nil // asked again
		}
		// No Student left; the CRD stays (no uninstall deletes it).
		students, err := stu.BolingcavalryV1().Students("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil // asked again
		}
		return len(pods.Items) == 0 && len(students.Items) == 0, nil
	}, func() string { return "hack/uninstall.sh said:\n" + out })
}

// publishedChart is the chart as a registry serves it: its OCI reference and version.
type publishedChart struct{ ref, version string }

// publishChart packages the chart at the repository's VERSION and pushes it to the
// node's registry, as make publish does.
func publishChart(t *testing.T) publishedChart {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(cp.Root, "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	version := strings.TrimSpace(string(b))
	dir := t.TempDir()
	run(t, "helm", "package", "charts/student-controller", "--version", version, "--app-version", version, "-d", dir)
	run(t, "helm", "push", filepath.Join(dir, "student-controller-"+version+".tgz"), "oci://"+nd.Registry+"/charts", "--plain-http")
	return publishedChart{ref: "oci://" + nd.Registry + "/charts/student-controller", version: version}
}
