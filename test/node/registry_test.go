package node

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/student-controller/student-controller/internal/testenv"
)

// row is a registry row as the tests compare it: every column, as text.
type row struct {
	namespace, name, studentName, school, owner, policy string
	generation                                          string
	createdAt, updatedAt, releasedAt                    string
}

// registryFile is the path, on this machine, of the SQLite file on the claim: in the
// local PersistentVolume bound to it.
func registryFile(t *testing.T, claim string) string {
	t.Helper()
	ctx := context.Background()
	pvc, err := kube.CoreV1().PersistentVolumeClaims(systemNamespace).Get(ctx, claim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pvc.Spec.VolumeName == "" {
		t.Fatalf("claim %s is not bound", claim)
	}
	pv, err := kube.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pv.Spec.Local == nil {
		t.Fatalf("volume %s is not one of the node's local volumes", pv.Name)
	}
	return filepath.Join(pv.Spec.Local.Path, "student-registry.db")
}

// sqliteRows reads every row of the registry file with Debian's sqlite3 as the Pod's
// user (65532), as another program on the volume would: it never leaves a file the
// controller cannot open (a WAL index owned by root).
func sqliteRows(t *testing.T, path string) map[string]row {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const query = `SELECT uid, namespace, name, student_name, school, COALESCE(owner, ''), COALESCE(deletion_policy, ''),
		generation, created_at, updated_at, COALESCE(released_at, '') FROM students ORDER BY uid`
	cmd := exec.CommandContext(ctx, "setpriv", "--reuid=65532", "--regid=65532", "--clear-groups", // #nosec G204 -- fixed arguments
		"sqlite3", "-bail", "-separator", "\t", "-cmd", ".timeout 5000", path, query)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("sqlite3 %s: %v\n%s", path, err, out)
	}
	rows := map[string]row{}
	for line := range strings.Lines(string(out)) {
		f := strings.Split(strings.TrimSuffix(line, "\n"), "\t")
		if len(f) != 11 {
			t.Fatalf("sqlite3 %s: a row of %d columns, want 11: %q", path, len(f), line)
		}
		rows[f[0]] = row{namespace: f[1], name: f[2], studentName: f[3], school: f[4], owner: f[5], policy: f[6],
			generation: f[7], createdAt: f[8], updatedAt: f[9], releasedAt: f[10]}
	}
	return rows
}

// readyPodsNow are the controller's Pods that are Ready and not going away.
func readyPodsNow(ctx context.Context) []corev1.Pod {
	list, err := kube.CoreV1().Pods(systemNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=student-controller"})
	if err != nil {
		return nil
	}
	var pods []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil && podReady(&p) {
			pods = append(pods, p)
		}
	}
	return pods
}

// scraper is what Prometheus would be: a ServiceAccount bound to the metrics-reader
// ClusterRole, with a token from the TokenRequest API.
func scraper(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	const ns, name = "monitoring", "prometheus"
	monitoring := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
	if _, err := kube.CoreV1().Namespaces().Create(ctx, monitoring, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	id, err := cp.ServiceAccount(ctx, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "prometheus-student-controller-metrics"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "student-controller-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}},
	}
	if _, err := kube.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	return id.Config.BearerToken
}

// scrape GETs /metrics through the metrics Service's ClusterIP (kube-proxy's rules
// carry it to a Pod) with token as the bearer ("" for none); the status and body.
func scrape(t *testing.T, token string) (int, string) {
	t.Helper()
	svc, err := kube.CoreV1().Services(systemNamespace).Get(context.Background(), "student-controller-metrics", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return scrapeAt(net.JoinHostPort(svc.Spec.ClusterIP, fmt.Sprint(svc.Spec.Ports[0].Port)), token)
}

// scrapePod GETs /metrics from one Pod, at its own address: through the Service, a
// Pod that is going away may still answer until kube-proxy hears of it.
func scrapePod(t *testing.T, pod *corev1.Pod, token string) (int, string) {
	t.Helper()
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name == "metrics" {
				return scrapeAt(net.JoinHostPort(pod.Status.PodIP, fmt.Sprint(p.ContainerPort)), token)
			}
		}
	}
	t.Fatalf("Pod %s has no port named metrics", pod.Name)
	return 0, ""
}

func scrapeAt(hostPort, token string) (int, string) {
	// The controller's certificate is its own, self-made: Prometheus would be given
	// insecure_skip_verify or a CA, as docs/install.md says.
	client := &http.Client{Timeout: 10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} // #nosec G402 -- the controller's self-made certificate
	return testenv.ScrapeAs(client, "https://"+hostPort+"/metrics", token)
}

// waitSweptClean waits until the controller in pod reports a sweep that found the
// registry as it should be, and says what its counters of written rows and sweeps
// show.
func waitSweptClean(t *testing.T, pod *corev1.Pod) (clean bool, metrics string) {
	t.Helper()
	token := scraper(t)
	deadline := time.Now().Add(time.Minute)
	var body string
	for time.Now().Before(deadline) {
		var code int
		code, body = scrapePod(t, pod, token)
		if code == http.StatusOK && testenv.MetricSum(body, "student_controller_sweep_total", func(l string) bool { return l == `outcome="clean"` }) >= 1 {
			return true, body
		}
		time.Sleep(time.Second)
	}
	return false, body
}
