package e2e

import (
	"context"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/student-controller/student-controller/internal/testenv"
	"github.com/student-controller/student-controller/internal/testenv/registrytest"
)

// TestFencedWrite: a write that started under the Lease cannot commit after another
// replica took the Lease. On PostgreSQL a statement goes on in the server while its
// client is paused: here the leader's row write waits on a table lock that the test
// holds, the leader is paused (SIGSTOP), the standby takes over and writes the same
// row (and waits too), then the test lets the lock go while the old leader is still
// paused. Its write runs in the server, but cannot commit: the registry's write fence
// moved on at the takeover. An audit trigger counts the committed writes of the row;
// without the fence there would be two of the new generation, the late one the old
// leader's.
//
// On SQLite a write that waits on another program's lock waits in the controller's
// own process: a pause stops the wait with it, and on resume the write goes on. The
// same fence check, in the same transaction, rolls it back (the registry suite's "a
// write fenced by a newer writer" runs on both databases), and TestPausedLeader shows
// that a resumed leader starts no new write.
func TestFencedWrite(t *testing.T) {
	ctx := context.Background()
	ns := testenv.Namespace(t, kubeClient(), "e2e-")
	url, db := registrytest.PostgresBackend(pg).New(t)
	leaseRBAC(t, ns)
	url, password := registrytest.ForProcess(t, url)
	args := []string{
		"--kubeconfig", controllerID.Kubeconfig, "--namespace", ns,
		"--registry", url, "--registry-owner", owner,
		"--leader-elect", "--leader-elect-namespace", ns,
		"--leader-elect-lease-duration=4s", "--leader-elect-renew-deadline=3s", "--leader-elect-retry-period=1s",
		"--sync-timeout=2m", "--registry-lock-wait=2m", // the blocked write must outlast the takeover
	}
	args = append(args, password...)
	a, b := startReplicas(t, ns, args)
	if _, err := db.ExecContext(ctx, `
		CREATE TABLE audit (uid TEXT, op TEXT, generation BIGINT, school TEXT);
		CREATE FUNCTION audit_students() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO audit VALUES (NEW.uid, TG_OP, NEW.generation, NEW.school);
			RETURN NEW;
		END $$;
		CREATE TRIGGER audit AFTER INSERT OR UPDATE ON students FOR EACH ROW EXECUTE FUNCTION audit_students()`); err != nil {
		t.Fatal(err)
	}
	if _, err := students(ns).Create(ctx, newStudent("fenced", "深圳中学", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s := waitAllReady(t, ns, 1, time.Minute)[0]

	lock, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if _, err := lock.ExecContext(ctx, `BEGIN; LOCK TABLE students IN EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	released := false
	defer func() {
		if !released {
			_, _ = lock.ExecContext(ctx, `ROLLBACK`)
		}
	}()
	s.Spec.School = "北京四中"
	if _, err := students(ns).Update(ctx, &s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitWritesBlocked(t, 1)
	a.signal(syscall.SIGSTOP)
	defer a.signal(syscall.SIGCONT)
	waitLeader(t, a, a, b)
	// The new leader's write of the same row: it took the fence before it synced.
	waitWritesBlocked(t, 2)

	if _, err := lock.ExecContext(ctx, `ROLLBACK`); err != nil {
		t.Fatal(err)
	}
	released = true
	time.Sleep(time.Second) // the old leader's statement runs in the server meanwhile
	a.signal(syscall.SIGCONT)
	if err := a.wait(30 * time.Second); err == nil {
		t.Error("the resumed former leader exited 0, want an error: it was fenced and lost the Lease")
	}
	waitAllReady(t, ns, 1, time.Minute)

	var writes int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM audit WHERE uid = $1 AND school = '北京四中'`, string(s.UID)).Scan(&writes); err != nil {
		t.Fatal(err)
	}
	if writes != 1 {
		t.Errorf("the new spec was committed %d times, want once: the old leader's late write committed", writes)
	}
}

// waitWritesBlocked waits until n writes of the registry's students table wait on a lock.
func waitWritesBlocked(t *testing.T, n int) {
	t.Helper()
	admin := openPG(t, pg, "postgres")
	waitFor(t, 30*time.Second, "registry writes waiting on the test's lock", func() bool {
		var waiting int
		err := admin.QueryRow(`SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%INSERT INTO students%'`).Scan(&waiting)
		return err == nil && waiting >= n
	})
}
