// Package node runs what an operator installs (the image `make image` builds, the
// Helm chart, config/default, config/postgres) as Pods on a real node: the local
// control plane with a kubelet, containerd, kube-proxy and kube-scheduler beside it
// (package testenv/node). It needs root, as a kubelet does.
package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
	studentclient "github.com/student-controller/student-controller/pkg/generated/clientset/versioned"

	"github.com/student-controller/student-controller/internal/testenv"
	"github.com/student-controller/student-controller/internal/testenv/controlplane"
	"github.com/student-controller/student-controller/internal/testenv/node"
)

var (
	cp *controlplane.Env
	nd *node.Node
	// image is the controller's image as `make image` builds it, pushed to the node's
	// registry: repository and digest.
	image struct{ repository, digest string }
	kube  kubernetes.Interface
	stu   studentclient.Interface
)

func TestMain(m *testing.M) { os.Exit(runTests(m)) }

func runTests(m *testing.M) (code int) {
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "the node suite cannot run: %v\n", err)
		return 1
	}
	if os.Geteuid() != 0 {
		return fail(errors.New("it runs a kubelet, which needs root: run make test as root"))
	}
	ctx := context.Background()
	root, err := testenv.RepoRoot()
	if err != nil {
		return fail(err)
	}
	nd, err = node.New(ctx, root, node.Options{Log: func(f string, args ...any) { fmt.Fprintf(os.Stderr, f+"\n", args...) }})
	defer func() {
		if nd == nil {
			return
		}
		if err := nd.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stop the node: %v\n", err)
			code = 1
		}
		if left := node.Leftovers(nd.Dir); len(left) > 0 {
			fmt.Fprintf(os.Stderr, "the node left behind:\n  %s\n", strings.Join(left, "\n  "))
			code = 1
		}
	}()
	if err != nil {
		return fail(err)
	}
	if cp, err = controlplane.Start(controlplane.Options{Root: root, NodeAddress: node.IP.String(), WithoutAdmissionPolicy: true}); err != nil {
		return fail(err)
	}
	defer func() {
		if err := cp.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stop the control plane: %v\n", err)
			code = 1
		}
	}()
	if err := nd.Start(ctx, cp); err != nil {
		return fail(err)
	}
	kube = kubernetes.NewForConfigOrDie(cp.Config)
	stu = studentclient.NewForConfigOrDie(cp.Config)
	image.repository = nd.Registry + "/student-controller"
	if image.digest, err = makeImage(ctx, "node-test"); err != nil {
		return fail(err)
	}
	return m.Run()
}

// makeImage runs `make image` with the version given and pushes the image to the
// node's registry; it returns the image's digest.
func makeImage(ctx context.Context, version string) (string, error) {
	dir, err := os.MkdirTemp("", "student-image-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	cmd := exec.CommandContext(ctx, "make", "--no-print-directory", "image", "IMAGE_DIR="+dir, "VERSION="+version, // #nosec G204 -- make in the repository
		"IMAGE_PUSH="+image.repository+":"+version)
	cmd.Dir = cp.Root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("make image: %v\n%s%s", err, out, stderr.String())
	}
	return strings.TrimSpace(string(out)), nil
}

// run runs a command with the cluster's kubeconfig and fails the test when it fails.
func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := tryRun(name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

func tryRun(name string, args ...string) (string, error) {
	switch name {
	case "helm":
		name = filepath.Join(cp.Root, "bin", "tools", "helm")
	case "uninstall":
		name = filepath.Join(cp.Root, "hack", "uninstall.sh")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...) // #nosec G204 -- the test's own commands
	cmd.Dir = cp.Root
	cmd.Env = append(os.Environ(), "KUBECONFIG="+cp.Kubeconfig, "HELM="+filepath.Join(cp.Root, "bin", "tools", "helm"),
		// hack/uninstall.sh waits this long for the controller to let the Students go.
		"UNINSTALL_TIMEOUT=90s")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// restrictedNamespace makes a namespace whose Pods must meet the restricted Pod
// Security Standard, as config/manager's does.
func restrictedNamespace(t *testing.T, name string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
		"pod-security.kubernetes.io/enforce": "restricted",
	}}}
	if _, err := kube.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// testLabel marks the namespaces a test makes, which its install's cleanup deletes.
const testLabel = "student-controller.test/node"

// studentNamespace makes a namespace for a test's Students.
func studentNamespace(t *testing.T, name string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{testLabel: "true"}}}
	if _, err := kube.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// cleanupInstall makes sure, when the test ends however it ends, that the next test
// finds a cluster without this install: it runs hack/uninstall.sh with how (its
// arguments after --yes) if the test did not get to, deletes what is left the blunt
// way (a Student's finalizer too, if no controller is left to remove it), and waits
// until the test's namespaces are gone. Call it before installing.
func cleanupInstall(t *testing.T, how ...string) {
	t.Helper()
	t.Cleanup(func() {
		ctx := context.Background()
		if t.Failed() {
			t.Logf("what the cluster showed at the end:\n%s", describe(systemNamespace))
		}
		if _, err := kube.Discovery().ServerResourcesForGroupVersion("bolingcavalry.k8s.io/v1"); err == nil {
			// Briefly: a controller the test froze or broke deletes nothing.
			_, _ = tryRun("uninstall", append([]string{"--yes"}, how...)...)
		}
		switch how[0] {
		case "helm":
			_, _ = tryRun("helm", "uninstall", how[1], "--namespace", how[2], "--ignore-not-found", "--wait")
		case "kustomize":
			_, _ = tryRun("kubectl", "delete", "-k", how[1], "--ignore-not-found", "--wait=false")
		}
		if list, err := stu.BolingcavalryV1().Students("").List(ctx, metav1.ListOptions{}); err == nil {
			for _, s := range list.Items {
				_, _ = tryRun("kubectl", "-n", s.Namespace, "patch", "student", s.Name, "--type=merge", "-p", `{"metadata":{"finalizers":null}}`)
			}
		}
		_, _ = tryRun("kubectl", "delete", "crd", "students.bolingcavalry.k8s.io", "--ignore-not-found")
		namespaces, err := kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: testLabel})
		if err != nil {
			t.Error(err)
			return
		}
		names := []string{systemNamespace}
		for _, ns := range namespaces.Items {
			names = append(names, ns.Name)
		}
		for _, name := range names {
			_ = kube.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{})
		}
		err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			for _, name := range names {
				if _, err := kube.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
					return false, nil
				}
			}
			return true, nil
		})
		if err != nil {
			t.Errorf("the test's namespaces %v not gone within 2 minutes: %v", names, err)
		}
	})
}

// eventually polls cond every half second until it holds or timeout passes; then it
// fails the test, saying what it waited for and, from diagnose, what it saw.
func eventually(t *testing.T, timeout time.Duration, what string, cond func(ctx context.Context) (bool, error), diagnose ...func() string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 500*time.Millisecond, timeout, true, cond)
	if err != nil {
		var more []string
		for _, d := range diagnose {
			more = append(more, d())
		}
		t.Fatalf("%s within %s: %v\n%s", what, timeout, err, strings.Join(more, "\n"))
	}
}

// readyPods waits until want Pods of the app in namespace are Ready, and returns them.
func readyPods(t *testing.T, namespace string, want int, timeout time.Duration) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	eventually(t, timeout, fmt.Sprintf("%d Ready controller Pods in %s", want, namespace), func(ctx context.Context) (bool, error) {
		list, err := kube.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=student-controller"})
		if err != nil {
			return false, err
		}
		pods = pods[:0]
		for _, p := range list.Items {
			if p.DeletionTimestamp == nil && podReady(&p) {
				pods = append(pods, p)
			}
		}
		return len(pods) == want, nil
	}, func() string { return describe(namespace) })
	return pods
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// describe is what an operator would look at when the Pods do not come up: the Pods,
// the namespace's Events, the controller's logs and the kubelet's last lines.
func describe(namespace string) string {
	pods, _ := tryRun("kubectl", "-n", namespace, "describe", "pods")
	events, _ := tryRun("kubectl", "-n", namespace, "get", "events", "--sort-by=.lastTimestamp")
	logs, _ := tryRun("kubectl", "-n", namespace, "logs", "-l", "app.kubernetes.io/name=student-controller", "--tail=30", "--prefix", "--all-containers")
	return fmt.Sprintf("--- kubectl describe pods\n%s\n--- events\n%s\n--- logs\n%s\n--- kubelet\n%s", pods, events, logs, nd.Kubelet.Tail(20))
}

// newStudent creates a Student in namespace with the deletion policy given.
func newStudent(t *testing.T, namespace, name string, policy studentv1.DeletionPolicy) *studentv1.Student {
	t.Helper()
	s := &studentv1.Student{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec:       studentv1.StudentSpec{Name: "Student " + name, School: "School of " + namespace, DeletionPolicy: policy},
	}
	// Right after an install the CRD may not be served yet: try for a while, and say
	// the last error.
	var created *studentv1.Student
	var last error
	eventually(t, 30*time.Second, "Student "+namespace+"/"+name+" created", func(ctx context.Context) (bool, error) {
		created, last = stu.BolingcavalryV1().Students(namespace).Create(ctx, s, metav1.CreateOptions{})
		return last == nil, nil
	}, func() string { return fmt.Sprintf("last error: %v", last) })
	return created
}

// waitReady waits until the Student is Ready for its current generation.
func waitReady(t *testing.T, namespace, name string, diagnose ...func() string) *studentv1.Student {
	t.Helper()
	var s *studentv1.Student
	eventually(t, time.Minute, "Student "+namespace+"/"+name+" Ready", func(ctx context.Context) (bool, error) {
		var err error
		if s, err = stu.BolingcavalryV1().Students(namespace).Get(ctx, name, metav1.GetOptions{}); err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(s.Status.Conditions, studentv1.ConditionReady)
		return c != nil && c.Status == metav1.ConditionTrue && c.ObservedGeneration == s.Generation, nil
	}, diagnose...)
	return s
}
