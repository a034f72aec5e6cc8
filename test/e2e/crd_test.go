package e2e

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensions "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/student-controller/student-controller/internal/testenv"
	"github.com/student-controller/student-controller/internal/testenv/controlplane"
	"github.com/student-controller/student-controller/internal/testenv/ctrlbin"
	"github.com/student-controller/student-controller/internal/testenv/registrytest"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
	"github.com/student-controller/student-controller/pkg/generated/clientset/versioned"
)

// TestOldCRDRefused: on a cluster whose Student CRD is 0.2.0's (no spec.management),
// the controller writes nothing and is not ready, saying the CRD is older than it and
// what to apply; registry adopt makes no Student. Once this version's CRD is applied
// the controller goes on, and the Student waiting meanwhile becomes Ready. An older CRD
// applied again while it runs stops its writes and its readiness until this version's
// is back.
func TestOldCRDRefused(t *testing.T) {
	t.Parallel() // a control plane of its own
	ctx := context.Background()
	cp := controlplane.ForTest(t, controlplane.Options{WithoutControllerManager: true})
	crds := apiextensions.NewForConfigOrDie(cp.Config).ApiextensionsV1().CustomResourceDefinitions()
	current, err := crds.Get(ctx, "students.bolingcavalry.k8s.io", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(env.Root, "internal", "controller", "testdata", "crd-0.2.0.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var old apiextensionsv1.CustomResourceDefinition
	if err := sigsyaml.Unmarshal(b, &old); err != nil {
		t.Fatal(err)
	}
	setSpec := func(spec apiextensionsv1.CustomResourceDefinitionSpec) {
		t.Helper()
		crd, err := crds.Get(ctx, current.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		crd.Spec = spec
		if _, err := crds.Update(ctx, crd, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setSpec(old.Spec)

	const ns = "old-crd"
	if err := testenv.EnsureNamespace(ctx, kubernetes.NewForConfigOrDie(cp.Config), ns); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "registry.db")
	url := "sqlite://" + path
	p := startProcess(t, "controller", "--kubeconfig", cp.Kubeconfig, "--registry", url, "--registry-owner", owner, "--sweep-interval", "2s")
	waitFor(t, time.Minute, "/readyz to say the CRD is too old", func() bool {
		code, body, _ := get("http://" + p.ProbeAddr + "/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "older than this controller") && strings.Contains(body, "spec.management")
	})
	client := versioned.NewForConfigOrDie(cp.Config).BolingcavalryV1().Students(ns)
	// What an older CRD does, and why the controller refuses it: the API server drops
	// the field it lacks, so an observed Student would be managed.
	observed := newStudent("observed", "school A", "")
	observed.Spec.Management = studentv1.ManagementObserve
	if s, err := client.Create(ctx, observed, metav1.CreateOptions{}); err != nil || s.Spec.Management != "" {
		t.Fatalf("a Student with spec.management: Observe on 0.2.0's CRD: %v, management %q; want it created, the field pruned", err, s.Spec.Management)
	}
	if err := client.Delete(ctx, "observed", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Create(ctx, newStudent("waits", "school A", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // the workers would have synced it by now
	if s, err := client.Get(ctx, "waits", metav1.GetOptions{}); err != nil || s.Status.Registry != nil || len(s.Status.Conditions) > 0 {
		t.Errorf("the Student on the old CRD: status %+v, %v; want nothing written", s.Status, err)
	}
	// Not even the schema: the controller did not lead the registry.
	var tables int
	if err := registrytest.OpenSQLite(t, path).QueryRow(`SELECT count(*) FROM sqlite_master WHERE name = 'students'`).Scan(&tables); err != nil || tables != 0 {
		t.Errorf("the registry on the old CRD: %d students tables, %v; want none written", tables, err)
	}
	out, err := exec.Command(ctrlbin.Binary(t), "registry", "adopt", "--kubeconfig", cp.Kubeconfig, "--registry", url, // #nosec G204 -- the controller built for the test
		"--registry-owner", "another").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "older than this controller") {
		t.Errorf("registry adopt on the old CRD: %v; want a refusal naming the CRD:\n%s", err, out)
	}

	setSpec(current.Spec)
	waitAllReadyIn(t, client, 1, time.Minute)

	// An older CRD applied while the controller runs: not ready again, and no write,
	// which would drop spec.management of an observed Student (a status write stores
	// the object through the older schema). Its row, put in line meanwhile, is reported
	// once this version's CRD is back, and the Student still observes it.
	kept := newStudent("kept", "school A", "")
	kept.Spec.Management = studentv1.ManagementObserve
	if kept, err = client.Create(ctx, kept, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	reason := func(name string) string {
		s, err := client.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if c := meta.FindStatusCondition(s.Status.Conditions, studentv1.ConditionReady); c != nil {
			return c.Reason
		}
		return ""
	}
	waitFor(t, time.Minute, "the observed Student Drifted (no row yet)", func() bool { return reason("kept") == studentv1.ReasonDrifted })
	setSpec(old.Spec)
	waitFor(t, time.Minute, "/readyz to say the CRD applied is too old", func() bool {
		code, body, _ := get("http://" + p.ProbeAddr + "/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "spec.management")
	})
	db := registrytest.OpenSQLite(t, path)
	if _, err := db.Exec(`INSERT INTO students (uid, namespace, name, student_name, school) VALUES ($1, $2, 'kept', '学生 kept', 'school A')`,
		string(kept.UID), ns); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second) // two sweeps would have synced it
	if got := reason("kept"); got != studentv1.ReasonDrifted {
		t.Errorf("the observed Student under the older CRD: reason %q; want Drifted, its status not written", got)
	}
	setSpec(current.Spec)
	waitFor(t, time.Minute, "/readyz once this version's CRD is back", func() bool {
		code, _, _ := get("http://" + p.ProbeAddr + "/readyz")
		return code == http.StatusOK
	})
	waitFor(t, time.Minute, "the observed Student InLine", func() bool { return reason("kept") == studentv1.ReasonInLine })
	if s, err := client.Get(ctx, "kept", metav1.GetOptions{}); err != nil || s.Spec.Management != studentv1.ManagementObserve {
		t.Errorf("the Student after the older CRD came and went: management %q, %v; want Observe", s.Spec.Management, err)
	}
	var owned int
	if err := db.QueryRow(`SELECT count(*) FROM students WHERE owner IS NOT NULL AND uid = $1`, string(kept.UID)).Scan(&owned); err != nil || owned != 0 {
		t.Errorf("the observed row: owned %d, %v; want it left as the other system wrote it", owned, err)
	}
}
