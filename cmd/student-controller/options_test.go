package main

import (
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/student-controller/student-controller/internal/mark"
)

// validated parses args as the controller's flags, as main does, and returns the
// options and what validate said of them.
func validated(t *testing.T, args []string) (options, error) {
	t.Helper()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	var o options
	o.addFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	o.recordSet(fs)
	err := o.validate() // before o is read: validate settles some of its fields
	return o, err
}

// TestResyncDefault: the resync is a rare backstop while the sweep finds drift, and
// finds it itself, every ten minutes, when the sweep is off; a period given stays.
func TestResyncDefault(t *testing.T) {
	tests := map[string]struct {
		args []string
		want time.Duration
	}{
		"defaults":                {want: 10 * time.Hour},
		"sweep off":               {args: []string{"--sweep-interval=0"}, want: 10 * time.Minute},
		"sweep off, resync given": {args: []string{"--sweep-interval=0", "--resync-period=1h"}, want: time.Hour},
		"sweep off, resync off":   {args: []string{"--sweep-interval=0", "--resync-period=0"}, want: 0},
		"sweep on, resync given":  {args: []string{"--sweep-interval=1m", "--resync-period=30m"}, want: 30 * time.Minute},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			o, err := validated(t, tc.args)
			if err != nil {
				t.Fatal(err)
			}
			if o.resyncPeriod != tc.want {
				t.Errorf("resync period %v, want %v", o.resyncPeriod, tc.want)
			}
		})
	}
}

// TestValidate: flag combinations that cannot work are refused at start, each with
// what is wrong.
func TestValidate(t *testing.T) {
	tests := map[string]struct {
		args []string
		want string // "" for valid
	}{
		"defaults":                          {},
		"postgres, two replicas":            {args: []string{"--registry=postgres://u@db/s", "--leader-elect"}},
		"sqlite, shared file":               {args: []string{"--leader-elect", "--sqlite-shared-file"}},
		"sqlite with leader election":       {args: []string{"--leader-elect"}, want: "replicas with a file each would split the registry"},
		"a password in the URL":             {args: []string{"--registry=postgres://u:hunter2@db/s"}, want: "--registry holds a password"},
		"a user and no password in the URL": {args: []string{"--registry=postgres://u@db/s"}},
		"a password parameter in the URL":   {args: []string{"--registry=postgres://u@db/s?PassWord=x"}, want: "--registry holds a password"},
		"password file for sqlite":          {args: []string{"--registry-password-file=/p"}, want: "SQLite takes no password"},
		"no lock wait":                      {args: []string{"--registry-lock-wait=0"}, want: "--registry-lock-wait must be positive"},
		"shared file without sqlite":        {args: []string{"--registry=postgres://u@db/s", "--leader-elect", "--sqlite-shared-file"}, want: "--sqlite-shared-file is for"},
		"shared file without election":      {args: []string{"--sqlite-shared-file"}, want: "--sqlite-shared-file is for"},
		"secure metrics, no metrics":        {args: []string{"--metrics-secure", "--metrics-bind-address=0"}, want: "no metrics endpoint to secure"},
		"lease flags without election":      {args: []string{"--leader-elect-retry-period=1s"}, want: "--leader-elect-retry-period without --leader-elect"},
		"the Lease's name names the mark":   {args: []string{"--leader-elect-id=x", "--leader-elect-namespace=y"}},
		"sweep percent out of range":        {args: []string{"--sweep-max-deletion-percent=0"}, want: "--sweep-max-deletion-percent must be within 1 and 100"},
		"workers":                           {args: []string{"--workers=0"}, want: "--workers must be at least 1"},
		"a pool the database sizes":         {args: []string{"--registry-max-open-conns=0", "--registry-max-idle-conns=0"}},
		"a pool that cannot be":             {args: []string{"--registry-max-open-conns=-1"}, want: "--registry-max-open-conns and --registry-max-idle-conns must not be negative"},
		"several namespaces, a selector":    {args: []string{"--namespace=a,b", "--selector=team in (x,y)"}},
		"a namespace that cannot be":        {args: []string{"--namespace=a,B"}, want: `--namespace or --selector: namespace "B"`},
		"tracing":                           {args: []string{"--tracing-endpoint=localhost:4317", "--tracing-sampling-rate-per-million=100"}},
		"a tracing rate without tracing":    {args: []string{"--tracing-sampling-rate-per-million=100"}, want: "without --tracing-endpoint does nothing"},
		"a tracing rate of none":            {args: []string{"--tracing-endpoint=localhost:4317", "--tracing-sampling-rate-per-million=0"}, want: "must be within 1 and 1000000"},
		"a tracing endpoint that cannot be": {args: []string{"--tracing-endpoint=local host:4317"}, want: "--tracing-endpoint: tracing.endpoint"},
		"a selector that cannot be":         {args: []string{"--selector=team in x"}, want: `--namespace or --selector: label selector "team in x"`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := validated(t, tc.args)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("validate: %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("validate: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestMarkPlace: the mark is kept beside the Lease and named after it, unless
// --registry-mark-namespace names its namespace; outside a Pod without leader
// election, nowhere.
func TestMarkPlace(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "")
	tests := map[string]struct {
		opts options
		want mark.Place
	}{
		"leader election":    {options{leaderElect: true, leaderElectID: "stu"}, mark.Place{Namespace: "kube-system", Name: "stu-registry-mark"}},
		"the Lease's":        {options{leaderElect: true, leaderElectID: "stu", leaderElectNamespace: "ops"}, mark.Place{Namespace: "ops", Name: "stu-registry-mark"}},
		"given":              {options{leaderElectID: "stu", markNamespace: "ops"}, mark.Place{Namespace: "ops", Name: "stu-registry-mark", Given: true}},
		"no leader election": {options{leaderElectID: "stu"}, mark.Place{Name: "stu-registry-mark"}},
	}
	for name, tc := range tests {
		if got := markPlace(tc.opts); got != tc.want {
			t.Errorf("%s: %+v, want %+v", name, got, tc.want)
		}
	}
}
