// Package pgtest starts a real PostgreSQL server for tests: the machine's PostgreSQL
// binaries, a fresh cluster in a temporary folder, a free port on 127.0.0.1, run as the
// postgres user when the tests run as root (the server refuses root).
package pgtest

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/student-controller/student-controller/internal/testenv/freeport"
)

// Password is the superuser's password on every test server. Tests assert it never
// shows in logs or Events.
const Password = "pg-test-s3cret-9f2c" // #nosec G101 -- a throwaway test server's, on loopback

// Server is a running PostgreSQL server.
type Server struct {
	dir   string
	bin   string
	port  int
	creds *syscall.Credential
	// also is an address the server listens on besides 127.0.0.1 (ListenFor).
	also string
	// tls: the server takes TLS connections (EnableTLS).
	tls bool
}

// BinDir is where Debian's postgresql-15 package puts the server binaries; the
// PGTEST_BIN environment variable points elsewhere.
func BinDir() string {
	if dir := os.Getenv("PGTEST_BIN"); dir != "" {
		return dir
	}
	return "/usr/lib/postgresql/15/bin"
}

// Start initialises a cluster in a new temporary folder and starts its server.
func Start(ctx context.Context) (*Server, error) {
	bin := BinDir()
	for _, b := range []string{"initdb", "pg_ctl", "postgres"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			return nil, fmt.Errorf("PostgreSQL server binaries not found in %s (install the Debian package postgresql, or set PGTEST_BIN): %w", bin, err)
		}
	}
	s := &Server{bin: bin}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root, the server needs the postgres user (the Debian package postgresql creates it): %w", err)
		}
		uid, uidErr := strconv.ParseUint(u.Uid, 10, 32)
		gid, gidErr := strconv.ParseUint(u.Gid, 10, 32)
		if err := errors.Join(uidErr, gidErr); err != nil {
			return nil, fmt.Errorf("the postgres user's IDs %q and %q: %w", u.Uid, u.Gid, err)
		}
		s.creds = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	var err error
	// Not under a test's TempDir: its parents are private to root.
	if s.dir, err = os.MkdirTemp("", "pgtest-"); err != nil {
		return nil, err
	}
	if s.creds != nil {
		if err := os.Chown(s.dir, int(s.creds.Uid), int(s.creds.Gid)); err != nil {
			return nil, errors.Join(err, s.cleanup())
		}
	}
	pwfile := filepath.Join(s.dir, "pwfile")
	if err := s.writeFile(pwfile, Password+"\n"); err != nil {
		return nil, errors.Join(err, s.cleanup())
	}
	if out, err := s.command(ctx, "initdb", "-D", s.data(), "-U", "postgres", "--pwfile", pwfile,
		"--auth-local=trust", "--auth-host=scram-sha-256", "--encoding=UTF8", "--locale=C.UTF-8").CombinedOutput(); err != nil {
		return nil, errors.Join(fmt.Errorf("initdb: %v\n%s", err, out), s.cleanup())
	}
	if s.port, err = freeport.Get(); err != nil {
		return nil, errors.Join(err, s.cleanup())
	}
	if err := s.Start(ctx); err != nil {
		return nil, errors.Join(err, s.cleanup())
	}
	return s, nil
}

func (s *Server) data() string { return filepath.Join(s.dir, "data") }

// Addr is the server's host:port.
func (s *Server) Addr() string { return fmt.Sprintf("127.0.0.1:%d", s.port) }

// URL is a registry URL for database db, with the password left out when
// withPassword is false (the caller passes it another way).
func (s *Server) URL(db string, withPassword bool) string {
	u := url.URL{Scheme: "postgres", Host: s.Addr(), Path: "/" + db, RawQuery: "sslmode=disable"}
	if withPassword {
		u.User = url.UserPassword("postgres", Password)
	} else {
		u.User = url.User("postgres")
	}
	return u.String()
}

// CreateDatabase creates an empty database.
func (s *Server) CreateDatabase(ctx context.Context, name string) error {
	return s.admin(ctx, `CREATE DATABASE "`+strings.ReplaceAll(name, `"`, ``)+`"`)
}

// DropDatabase drops database name, closing its connections first.
func (s *Server) DropDatabase(ctx context.Context, name string) error {
	return s.admin(ctx, `DROP DATABASE IF EXISTS "`+strings.ReplaceAll(name, `"`, ``)+`" WITH (FORCE)`)
}

// admin runs statement in the postgres database.
func (s *Server) admin(ctx context.Context, statement string) error {
	db, err := sql.Open("pgx", s.URL("postgres", true))
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.ExecContext(ctx, statement)
	return err
}

// Start starts the server (again, after Stop) on the same folder and port.
func (s *Server) Start(ctx context.Context) error {
	listen := "127.0.0.1"
	if s.also != "" {
		listen += "," + s.also
	}
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=%s -c fsync=off -c max_connections=200", s.port, s.dir, listen) + s.tlsOptions()
	out, err := s.command(ctx, "pg_ctl", "-D", s.data(), "-o", opts, "-l", filepath.Join(s.dir, "server.log"), "-w", "-t", "60", "start").CombinedOutput()
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
		return fmt.Errorf("pg_ctl start: %v\n%s\n%s", err, out, log)
	}
	return nil
}

// Stop stops the server at once (fast shutdown: open connections are cut).
func (s *Server) Stop(ctx context.Context) error {
	out, err := s.command(ctx, "pg_ctl", "-D", s.data(), "-m", "fast", "-w", "-t", "60", "stop").CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl stop: %v\n%s", err, out)
	}
	return nil
}

// Kill SIGKILLs the server and every backend process at once, as the kernel's OOM
// killer or a lost node would: no shutdown checkpoint, the next Start recovers from the
// write-ahead log. pg_ctl makes the postmaster a process group leader, so its group is
// the whole server.
func (s *Server) Kill() error {
	pidFile, err := os.ReadFile(filepath.Join(s.data(), "postmaster.pid"))
	if err != nil {
		return fmt.Errorf("kill PostgreSQL: %w", err)
	}
	first, _, _ := strings.Cut(string(pidFile), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 1 {
		return fmt.Errorf("kill PostgreSQL: postmaster.pid starts with %q, not a process ID", first)
	}
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill PostgreSQL's process group %d: %w", pid, err)
	}
	// Wait until the postmaster is gone, so that a Start that follows finds its lock
	// file stale rather than held.
	for deadline := time.Now().Add(10 * time.Second); alive(pid); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			return fmt.Errorf("kill PostgreSQL: postmaster %d still runs 10 s after SIGKILL", pid)
		}
	}
	return nil
}

// alive tells whether process pid runs: it exists and is not a zombie that its parent
// (init, for a postmaster whose pg_ctl has exited) has yet to reap.
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true // no /proc: the signal's answer is all there is
	}
	// The state follows the command name, which is in parentheses and may hold any
	// character, ")" too: so after the last ")".
	rest := string(stat[bytes.LastIndexByte(stat, ')')+1:])
	return !strings.HasPrefix(strings.TrimSpace(rest), "Z")
}

// Close stops the server if it runs and removes its folder.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var err error
	if _, statErr := os.Stat(filepath.Join(s.data(), "postmaster.pid")); statErr == nil {
		err = s.Stop(ctx)
	}
	return errors.Join(err, s.cleanup())
}

func (s *Server) cleanup() error { return os.RemoveAll(s.dir) }

func (s *Server) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(s.bin, name), args...)
	cmd.Dir = s.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C.UTF-8")
	if s.creds != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.creds}
	}
	return cmd
}

func (s *Server) writeFile(path, content string) error {
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil { // #nosec G703 -- a file in the test server's own folder
		return err
	}
	if s.creds != nil {
		return os.Chown(path, int(s.creds.Uid), int(s.creds.Gid))
	}
	return nil
}

// ListenFor makes the server listen on addr too (the machine's own address, which a
// node's Pods reach) and take password logins from the addresses in cidr (the Pods'),
// and restarts it.
func (s *Server) ListenFor(ctx context.Context, addr, cidr string) error {
	hba := filepath.Join(s.data(), "pg_hba.conf")
	b, err := os.ReadFile(hba) // #nosec G304 -- the test server's own file
	if err != nil {
		return err
	}
	if err := s.writeFile(hba, string(b)+"host all all "+cidr+" scram-sha-256\n"); err != nil {
		return err
	}
	if err := s.Stop(ctx); err != nil {
		return err
	}
	s.also = addr
	return s.Start(ctx)
}

// HostURL is URL with the host given (the address of ListenFor) in place of 127.0.0.1.
func (s *Server) HostURL(db, host string, withPassword bool) string {
	u, _ := url.Parse(s.URL(db, withPassword))
	u.Host = net.JoinHostPort(host, strconv.Itoa(s.port))
	return u.String()
}

// Port is the server's port on 127.0.0.1.
func (s *Server) Port() int { return s.port }

// StartStandby makes a streaming-replication standby of s in a new folder (a base
// backup over s's socket, as its postgres user) and starts it on a free port.
func (s *Server) StartStandby(ctx context.Context) (*Server, error) {
	standby := &Server{bin: s.bin, creds: s.creds}
	var err error
	if standby.dir, err = os.MkdirTemp("", "pgtest-standby-"); err != nil {
		return nil, err
	}
	if s.creds != nil {
		if err := os.Chown(standby.dir, int(s.creds.Uid), int(s.creds.Gid)); err != nil {
			return nil, errors.Join(err, standby.cleanup())
		}
	}
	// -R writes standby.signal and primary_conninfo (s's socket folder and port).
	// -c fast: a checkpoint at once, not one spread over minutes.
	if out, err := standby.command(ctx, "pg_basebackup", "-D", standby.data(), "-R", "-X", "stream", "-c", "fast",
		"-h", s.dir, "-p", strconv.Itoa(s.port), "-U", "postgres").CombinedOutput(); err != nil {
		return nil, errors.Join(fmt.Errorf("pg_basebackup: %v\n%s", err, out), standby.cleanup())
	}
	if standby.port, err = freeport.Get(); err != nil {
		return nil, errors.Join(err, standby.cleanup())
	}
	if err := standby.Start(ctx); err != nil {
		return nil, errors.Join(err, standby.cleanup())
	}
	return standby, nil
}

// Promote turns a standby into a primary that takes writes.
func (s *Server) Promote(ctx context.Context) error {
	if out, err := s.command(ctx, "pg_ctl", "-D", s.data(), "-w", "-t", "60", "promote").CombinedOutput(); err != nil {
		return fmt.Errorf("pg_ctl promote: %v\n%s", err, out)
	}
	return nil
}

// ForTest starts a server for one test (or benchmark) and stops it when that ends.
func ForTest(tb testing.TB) *Server {
	tb.Helper()
	s, err := Start(context.Background())
	if err != nil {
		tb.Fatalf("PostgreSQL is needed: %v", err)
	}
	tb.Cleanup(func() {
		if err := s.Close(); err != nil {
			tb.Errorf("stop PostgreSQL: %v", err)
		}
	})
	return s
}
