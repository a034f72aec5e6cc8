package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apiextensions "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/student-controller/student-controller/internal/testenv"
	"github.com/student-controller/student-controller/internal/testenv/controlplane"
	"github.com/student-controller/student-controller/pkg/generated/clientset/versioned"
)

// TestHelmUpgradeFromPrevious: the previous release's chart (0.3.0, from git) installs
// the CRD from its crds/ folder, which Helm does not own. A plain helm upgrade to this
// chart is refused, naming the CRD; helm upgrade --take-ownership, as upgrading.md
// says, makes the CRD the release's, with this chart's schema and keep policy. A
// rollback and an uninstall then leave the CRD, and the Student made before the
// upgrade, in place. (No kubelet here: the charts' Deployments never run.)
func TestHelmUpgradeFromPrevious(t *testing.T) {
	t.Parallel() // a control plane of its own
	ctx := context.Background()
	cp := controlplane.ForTest(t, controlplane.Options{WithoutControllerManager: true})
	crds := apiextensions.NewForConfigOrDie(cp.Config).ApiextensionsV1().CustomResourceDefinitions()
	const crd = "students.bolingcavalry.k8s.io"
	// The cluster as 0.3.0's chart leaves it: the CRD is its crds/ folder's.
	if err := crds.Delete(ctx, crd, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the CRD gone", func(ctx context.Context) (bool, error) {
		_, err := crds.Get(ctx, crd, metav1.GetOptions{})
		return err != nil, nil
	})
	previous := filepath.Join(t.TempDir(), "previous")
	if err := testenv.Archive(env.Root, testenv.PreviousRelease, previous, "charts/student-controller"); err != nil {
		t.Fatal(err)
	}
	helm := func(args ...string) (string, error) {
		cmd := exec.Command(filepath.Join(cp.Root, "bin", "tools", "helm"), append(args, "--kubeconfig", cp.Kubeconfig)...) // #nosec G204 -- the test's own arguments
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	common := []string{"--namespace", "student-controller-system", "--set", "admissionPolicy.enabled=false"}
	if out, err := helm(append([]string{"install", "student-controller", filepath.Join(previous, "charts", "student-controller"), "--create-namespace", "--wait=false"}, common...)...); err != nil {
		t.Fatalf("helm install of 0.3.0's chart: %v\n%s", err, out)
	}
	eventually(t, 30*time.Second, "0.3.0's CRD served", func(ctx context.Context) (bool, error) {
		_, err := versioned.NewForConfigOrDie(cp.Config).BolingcavalryV1().Students("default").List(ctx, metav1.ListOptions{})
		return err == nil, nil
	})
	client := versioned.NewForConfigOrDie(cp.Config).BolingcavalryV1().Students("default")
	if _, err := client.Create(ctx, newStudent("kept", "school A", "Delete"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	chart := filepath.Join(cp.Root, "charts", "student-controller")
	if out, err := helm(append([]string{"upgrade", "student-controller", chart}, common...)...); err == nil || !strings.Contains(out, crd) {
		t.Errorf("a plain helm upgrade over 0.3.0's CRD: %v; want a refusal naming the CRD:\n%s", err, out)
	}
	if out, err := helm(append([]string{"upgrade", "student-controller", chart, "--take-ownership"}, common...)...); err != nil {
		t.Fatalf("helm upgrade --take-ownership: %v\n%s", err, out)
	}
	got, err := crds.Get(ctx, crd, metav1.GetOptions{})
	if err != nil || got.Annotations["meta.helm.sh/release-name"] != "student-controller" || got.Annotations["helm.sh/resource-policy"] != "keep" {
		t.Fatalf("the CRD after the upgrade: %v, annotations %v; want the release's, kept", err, got.Annotations)
	}

	// A rollback to 0.3.0's chart, which renders no CRD, and an uninstall: the CRD and
	// the Student stay.
	for _, step := range [][]string{{"rollback", "student-controller", "1", "--namespace", "student-controller-system"},
		{"uninstall", "student-controller", "--namespace", "student-controller-system"}} {
		if out, err := helm(step...); err != nil {
			t.Fatalf("helm %s: %v\n%s", step[0], err, out)
		}
		if _, err := crds.Get(ctx, crd, metav1.GetOptions{}); err != nil {
			t.Errorf("the CRD after helm %s: %v; want it kept", step[0], err)
		}
		if _, err := client.Get(ctx, "kept", metav1.GetOptions{}); err != nil {
			t.Errorf("the Student after helm %s: %v; want it kept", step[0], err)
		}
	}
}
