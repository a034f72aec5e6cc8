package e2e

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/student-controller/student-controller/internal/testenv"
	"github.com/student-controller/student-controller/internal/testenv/ctrlbin"
	"github.com/student-controller/student-controller/internal/testenv/pgtest"
	"github.com/student-controller/student-controller/internal/testenv/registrytest"
)

// TestPostgresPasswordNeverShown runs the controller binary on PostgreSQL, with the
// password given each way it takes one (in REGISTRY_PASSWORD, in a file), through an
// outage, at high verbosity: the password shows in no log line and no Event. A URL
// with the password in it is refused at once, and the refusal does not show it either.
func TestPostgresPasswordNeverShown(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	pwFile := filepath.Join(dir, "password")
	if err := os.WriteFile(pwFile, []byte(pgtest.Password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Run("in the URL", func(t *testing.T) {
		db := registrytest.CreateDatabase(t, pg)
		cmd := exec.Command(ctrlbin.Binary(t), "--registry", pg.URL(db, true), "--kubeconfig", controllerID.Kubeconfig, // #nosec G204 -- the controller built for the test
			"--registry-owner", owner)
		out, err := cmd.CombinedOutput()
		if code := cmd.ProcessState.ExitCode(); code != 2 {
			t.Errorf("exit code %d (%v), want 2: a password in the URL is refused before anything starts; output:\n%s", code, err, out)
		}
		if !strings.Contains(string(out), "--registry-password-file") {
			t.Errorf("the refusal does not name the way to give the password:\n%s", out)
		}
		if strings.Contains(string(out), pgtest.Password) {
			t.Errorf("the refusal shows the password: %s", lineWith(string(out), pgtest.Password))
		}
	})
	ways := []struct {
		name string
		args []string
		env  []string
	}{
		{name: "REGISTRY_PASSWORD", env: []string{"REGISTRY_PASSWORD=" + pgtest.Password}},
		{name: "password file", args: []string{"--registry-password-file", pwFile}},
	}
	for _, way := range ways {
		t.Run(way.name, func(t *testing.T) {
			db := registrytest.CreateDatabase(t, pg)
			ns := testenv.Namespace(t, kubeClient(), "e2e-")
			args := append([]string{"--registry", pg.URL(db, false), "--kubeconfig", controllerID.Kubeconfig,
				"--namespace", ns, "--registry-owner", owner, "-v", "6"}, way.args...)
			p := startProcessEnv(t, "controller", way.env, args...)

			createMany(t, ns, 2, "before")
			waitAllReady(t, ns, 2, time.Minute)

			if err := pg.Stop(ctx); err != nil {
				t.Fatal(err)
			}
			createMany(t, ns, 1, "during")
			waitOutageShown(t, ns, "during-000")
			if err := pg.Start(ctx); err != nil {
				t.Fatal(err)
			}
			waitAllReady(t, ns, 3, 2*time.Minute)
			eventually(t, 20*time.Second, "the RegistryError Event", func(ctx context.Context) (bool, error) {
				events, err := kubeEvents(ctx, ns, "during-000")
				return containsReason(events, "RegistryError"), err
			})

			p.signal(syscall.SIGTERM)
			if err := p.wait(45 * time.Second); err != nil {
				t.Errorf("exit after SIGTERM: %v", err)
			}
			logs := p.Output()
			if !strings.Contains(logs, "Registry open") || !strings.Contains(logs, "RegistryError") {
				t.Errorf("the logs lack the lines this test looks through")
			}
			if strings.Contains(logs, pgtest.Password) {
				t.Errorf("the logs show the registry password: %s", lineWith(logs, pgtest.Password))
			}
			list, err := kubeClient().CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range list.Items {
				if strings.Contains(e.Message, pgtest.Password) {
					t.Errorf("Event %s shows the registry password: %s", e.Reason, e.Message)
				}
			}
		})
	}
}

func lineWith(text, s string) string {
	for _, line := range strings.Split(text, "\n") {
		if strings.Contains(line, s) {
			return fmt.Sprintf("%.300s", line)
		}
	}
	return ""
}

// TestPostgresTLSPrivateCA: a PostgreSQL whose certificate a private CA signed (as most
// managed and in-house servers are) is reached with verify-full, the URL's default,
// once the URL names the CA (sslrootcert); without it the controller connects to
// nothing, and its log says why.
func TestPostgresTLSPrivateCA(t *testing.T) {
	ctx := context.Background()
	server := pgtest.ForTest(t)
	tls, err := server.EnableTLS(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := server.CreateDatabase(ctx, "students"); err != nil {
		t.Fatal(err)
	}
	env := []string{"REGISTRY_PASSWORD=" + pgtest.Password}
	url := "postgres://postgres@" + server.Addr() + "/students"
	ns := testenv.Namespace(t, kubeClient(), "e2e-")
	args := func(url string) []string {
		return []string{"--registry", url, "--kubeconfig", controllerID.Kubeconfig, "--namespace", ns, "--registry-owner", owner}
	}

	// No CA: Go's roots do not know it.
	p := startProcessEnv(t, "controller-without-ca", env, args(url)...)
	eventually(t, time.Minute, "the log to say the server's certificate is not trusted", func(context.Context) (bool, error) {
		return strings.Contains(p.Output(), "certificate signed by unknown authority"), nil
	})
	p.signal(syscall.SIGTERM)
	if err := p.wait(45 * time.Second); err != nil {
		t.Logf("exit without the CA: %v", err)
	}

	p = startProcessEnv(t, "controller", env, args(url+"?sslmode=verify-full&sslrootcert="+tls.CAFile)...)
	createMany(t, ns, 2, "tls")
	waitAllReady(t, ns, 2, time.Minute)
	db, err := sql.Open("pgx", server.URL("students", true))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// This test's own connection aside (sslmode=disable), every one is the controller's.
	var connections, encrypted int
	if err := db.QueryRowContext(ctx, `SELECT count(*), count(*) FILTER (WHERE ssl) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid)
		WHERE datname = 'students' AND pid <> pg_backend_pid()`).Scan(&connections, &encrypted); err != nil || connections == 0 || encrypted != connections {
		t.Errorf("the controller's connections: %d, %d of them TLS (%v); want all TLS", connections, encrypted, err)
	}
}
