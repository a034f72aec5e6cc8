package node

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensions "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/student-controller/student-controller/internal/registry"
	"github.com/student-controller/student-controller/internal/testenv"
	"github.com/student-controller/student-controller/internal/testenv/ctrlbin"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

const studentCRD = "students.bolingcavalry.k8s.io"

// TestHelmUpgrade: the previous release (its chart and its controller, built from git
// at its commit and published to the node's registry as make publish publishes) is
// installed with helm, and Students of every kind are made: Delete, Orphan, observed,
// paused, and an Orphan one deleted (its row released). helm upgrade to this build,
// with --take-ownership as upgrading.md says: no row is lost or written again
// (updated_at included), the registry is at this build's schema, the CRD is the
// release's and kept on uninstall, spec.management is still served, and every
// Student is as it was: Ready, observed and in line, or held by its pause. helm
// rollback then brings the previous release back, which refuses the migrated
// registry, names the newer schema and writes nothing: the way back is the backup
// taken before the upgrade (upgrading.md).
func TestHelmUpgrade(t *testing.T) {
	ctx := context.Background()
	cleanupInstall(t, "helm", "student-controller", systemNamespace)
	restrictedNamespace(t, systemNamespace)
	// The cluster as the previous release finds it: no CRD, which its chart's crds/
	// folder installs.
	run(t, "kubectl", "delete", "crd", studentCRD, "--ignore-not-found", "--wait")
	previous := publishPrevious(t)
	run(t, "helm", "install", "student-controller", previous.chart.ref, "--version", previous.chart.version, "--plain-http",
		"--namespace", systemNamespace, "--set", "image.repository="+image.repository, "--set", "image.digest="+previous.digest)
	runningImage(t, previous.digest)

	ns := "node-upgrade"
	studentNamespace(t, ns)
	diagnose := func() string { return describe(systemNamespace) }
	made := map[string]*studentv1.Student{}
	for name, policy := range map[string]studentv1.DeletionPolicy{"delete": "Delete", "orphan": "Orphan", "observed": "Delete",
		"paused": "Orphan", "gone": "Orphan"} {
		made[name] = newStudent(t, ns, name, policy)
	}
	for name := range made {
		waitReady(t, ns, name, diagnose)
	}
	students := stu.BolingcavalryV1().Students(ns)
	patch := func(name, body string) {
		t.Helper()
		run(t, "kubectl", "-n", ns, "patch", "student", name, "--type=merge", "-p", body)
	}
	patch("observed", `{"spec":{"management":"Observe"}}`)
	patch("paused", `{"metadata":{"annotations":{"`+studentv1.AnnotationPaused+`":"true"}}}`)
	if err := students.Delete(ctx, "gone", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	checkStudents := func(when string) {
		t.Helper()
		waitCondition(t, ns, "delete", studentv1.ConditionReady, metav1.ConditionTrue, studentv1.ReasonSynced, diagnose)
		waitCondition(t, ns, "orphan", studentv1.ConditionReady, metav1.ConditionTrue, studentv1.ReasonSynced, diagnose)
		observed := waitCondition(t, ns, "observed", studentv1.ConditionReady, metav1.ConditionTrue, studentv1.ReasonInLine, diagnose)
		if observed.Spec.Management != studentv1.ManagementObserve {
			t.Errorf("%s: the observed Student's spec.management is %q, want Observe (a CRD without the field drops it)", when, observed.Spec.Management)
		}
		waitCondition(t, ns, "paused", studentv1.ConditionSynced, metav1.ConditionFalse, studentv1.ReasonPaused, diagnose)
	}
	checkStudents("before the upgrade")
	eventually(t, time.Minute, "Student gone deleted", func(ctx context.Context) (bool, error) {
		_, err := students.Get(ctx, "gone", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}, diagnose)
	db := registryFile(t, "student-controller-registry")
	if v := sqliteSchema(t, db); v != testenv.PreviousSchema {
		t.Fatalf("the previous release left schema %d, want %d", v, testenv.PreviousSchema)
	}
	before := sqliteRows(t, db)
	if len(before) != len(made) || before[string(made["gone"].UID)].releasedAt == "" {
		t.Fatalf("the previous release's rows: %+v; want %d, gone's released", before, len(made))
	}

	// The upgrade.
	chart := publishChart(t)
	run(t, "helm", "upgrade", "student-controller", chart.ref, "--version", chart.version, "--plain-http", "--namespace", systemNamespace,
		"--take-ownership", "--set", "image.repository="+image.repository, "--set", "image.digest="+image.digest)
	pod := runningImage(t, image.digest)
	eventually(t, time.Minute, fmt.Sprintf("schema %d", registry.LatestSchema()), func(context.Context) (bool, error) {
		return sqliteSchema(t, db) == registry.LatestSchema(), nil
	}, diagnose)
	clean, metrics := waitSweptClean(t, &pod)
	if !clean {
		t.Fatalf("this build's sweep did not find the registry clean; its metrics:\n%s\n%s", grepMetrics(metrics), diagnose())
	}
	if written := testenv.MetricSum(metrics, "student_controller_registry_rows_written_total", nil); written != 0 {
		t.Errorf("this build wrote %v rows after the upgrade, want none:\n%s", written, grepMetrics(metrics))
	}
	// The Students as this build found them once it had synced every one and swept.
	checkStudents("after the upgrade")
	after := sqliteRows(t, db)
	if !maps.Equal(before, after) {
		t.Errorf("the rows changed across the upgrade:\nbefore %+v\nafter  %+v", before, after)
	}
	crd, err := apiextensions.NewForConfigOrDie(cp.Config).ApiextensionsV1().CustomResourceDefinitions().Get(ctx, studentCRD, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if crd.Annotations["meta.helm.sh/release-name"] != "student-controller" || crd.Annotations["helm.sh/resource-policy"] != "keep" {
		t.Errorf("the CRD's annotations after the upgrade: %v; want the release's, kept", crd.Annotations)
	}

	// The rollback: the previous release refuses the migrated registry.
	run(t, "helm", "rollback", "student-controller", "1", "--namespace", systemNamespace)
	var said string
	eventually(t, 3*time.Minute, "the previous release to refuse the registry of a newer schema", func(ctx context.Context) (bool, error) {
		pods, err := kube.CoreV1().Pods(systemNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=student-controller"})
		if err != nil {
			return false, err
		}
		for _, p := range pods.Items {
			if !strings.Contains(p.Spec.Containers[0].Image, previous.digest) {
				continue
			}
			for _, which := range []string{"--previous=false", "--previous=true"} {
				out, _ := tryRun("kubectl", "-n", systemNamespace, "logs", p.Name, which)
				if strings.Contains(out, "newer than this controller knows") {
					said = out
					return true, nil
				}
			}
		}
		return false, nil
	}, diagnose)
	t.Logf("the previous release after the rollback said:\n%s", testenv.Tail([]byte(said), 3))
	if got := sqliteRows(t, db); !maps.Equal(after, got) {
		t.Errorf("the rows changed after the rollback:\nbefore %+v\nafter  %+v", after, got)
	}
	if v := sqliteSchema(t, db); v != registry.LatestSchema() {
		t.Errorf("the schema after the rollback: %d, want %d", v, registry.LatestSchema())
	}
}

// previousRelease is the previous release as a registry serves it: its chart, and the
// digest of its image (the controller built from git at its commit).
type previousRelease struct {
	chart  publishedChart
	digest string
}

// publishPrevious builds the previous release's controller from git, makes its image
// with this repository's image tool and pushes it and the release's chart to the
// node's registry, as make publish does.
func publishPrevious(t *testing.T) previousRelease {
	t.Helper()
	ctx := context.Background()
	src := t.TempDir()
	if err := testenv.Archive(cp.Root, testenv.PreviousRelease, src); err != nil {
		t.Fatal(err)
	}
	bin, err := ctrlbin.Build{Root: src, Out: filepath.Join(t.TempDir(), "student-controller")}.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, "go", "run", "-trimpath", ".", "-binary", bin, "-out", filepath.Join(t.TempDir(), "oci"), // #nosec G204 -- the repository's image tool
		"-version", testenv.PreviousVersion, "-revision", testenv.PreviousRelease, "-push", image.repository+":"+testenv.PreviousVersion)
	cmd.Dir = filepath.Join(cp.Root, "hack", "tools", "image")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the previous release's image: %v\n%s%s", err, out, stderr.String())
	}
	dir := t.TempDir()
	run(t, "helm", "package", filepath.Join(src, "charts", "student-controller"), "--version", testenv.PreviousVersion,
		"--app-version", testenv.PreviousVersion, "-d", dir)
	run(t, "helm", "push", filepath.Join(dir, "student-controller-"+testenv.PreviousVersion+".tgz"), "oci://"+nd.Registry+"/charts", "--plain-http")
	return previousRelease{
		chart:  publishedChart{ref: "oci://" + nd.Registry + "/charts/student-controller", version: testenv.PreviousVersion},
		digest: strings.TrimSpace(string(out)),
	}
}

// runningImage waits until the one controller Pod that is Ready runs the image of
// digest, and returns it.
func runningImage(t *testing.T, digest string) corev1.Pod {
	t.Helper()
	var pod corev1.Pod
	eventually(t, 3*time.Minute, "a Ready controller Pod of image "+digest, func(ctx context.Context) (bool, error) {
		pods := readyPodsNow(ctx)
		if len(pods) != 1 || !strings.Contains(pods[0].Spec.Containers[0].Image, digest) {
			return false, nil
		}
		pod = pods[0]
		return true, nil
	}, func() string { return describe(systemNamespace) })
	return pod
}

// waitCondition waits until the Student's condition of type has status and reason for
// its current generation, and returns the Student.
func waitCondition(t *testing.T, namespace, name, condition string, status metav1.ConditionStatus, reason string, diagnose func() string) *studentv1.Student {
	t.Helper()
	var s *studentv1.Student
	eventually(t, time.Minute, fmt.Sprintf("Student %s/%s %s=%s (%s)", namespace, name, condition, status, reason), func(ctx context.Context) (bool, error) {
		var err error
		if s, err = stu.BolingcavalryV1().Students(namespace).Get(ctx, name, metav1.GetOptions{}); err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(s.Status.Conditions, condition)
		return c != nil && c.Status == status && c.Reason == reason && c.ObservedGeneration == s.Generation, nil
	}, diagnose)
	return s
}

// sqliteSchema is the schema version of the registry file, read as sqliteRows reads.
func sqliteSchema(t *testing.T, path string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "setpriv", "--reuid=65532", "--regid=65532", "--clear-groups", // #nosec G204 -- fixed arguments
		"sqlite3", "-bail", "-cmd", ".timeout 5000", path, "SELECT MAX(version) FROM schema_migrations")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("sqlite3 %s: %v\n%s", path, err, out)
	}
	var v int
	if _, err := fmt.Sscan(string(out), &v); err != nil {
		t.Fatalf("the schema version %q: %v", out, err)
	}
	return v
}
