package main

import (
	"flag"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/student-controller/student-controller/internal/controller"
)

// The reference pages in docs/ are rendered from the code: the flags from their help
// text, the metrics from their Help strings. `make generate` writes them
// (UPDATE_DOCS=1); `make test` and `make check` fail when a page and the code disagree.

const generatedNote = "<!-- Generated from the code by `make generate` (cmd/student-controller/docs_test.go); do not edit. -->\n"

func TestFlagsDoc(t *testing.T) {
	var opts options
	fs := flag.NewFlagSet("student-controller", flag.ContinueOnError)
	opts.addCommandFlags(fs)
	logging := flag.NewFlagSet("logging", flag.ContinueOnError)
	addLoggingFlags(logging)

	var b strings.Builder
	b.WriteString("# Flags\n\n" + generatedNote + "\n")
	b.WriteString("`student-controller [flags]` runs the controller; `student-controller registry` changes what the " +
		"registry records about its owners (`student-controller registry` prints how). Every flag also takes the form " +
		"`-flag`; a duration is Go's (`90s`, `5m`, `1h30m`).\n\n")
	b.WriteString(flagTable(fs))
	b.WriteString("\n## Logging\n\nThe controller logs through klog with the logging flags of Kubernetes' own components " +
		"(k8s.io/component-base/logs). `-v=2` shows each row written, `-v=4` each sync; `--logging-format=json` writes one " +
		"JSON object per line, with the same key-value pairs (`student`, `uid`, `action`, `generation`, `duration`).\n\n")
	b.WriteString(flagTable(logging))
	var rf registryFlags
	registry := flag.NewFlagSet("registry", flag.ContinueOnError)
	rf.add(registry)
	b.WriteString("\n## The registry subcommands\n\n`student-controller registry move-cluster|rename-owner|backup|adopt|prune|confirm-restore` " +
		"take the flags above that name the registry, its owner and the cluster (`--registry`, `--registry-owner`, " +
		"`--registry-password-file`, `--kubeconfig`, `--namespace`, `--dry-run`), and these of their own; each says which " +
		"subcommands take it.\n\n")
	b.WriteString(flagTable(registry))
	golden(t, "../../docs/flags.md", b.String())
}

func flagTable(fs *flag.FlagSet) string {
	var b strings.Builder
	b.WriteString("| flag | default | what |\n|---|---|---|\n")
	fs.VisitAll(func(f *flag.Flag) {
		def := f.DefValue
		if def != "" {
			def = "`" + def + "`"
		}
		fmt.Fprintf(&b, "| `--%s` | %s | %s |\n", f.Name, def, strings.ReplaceAll(f.Usage, "|", `\|`))
	})
	return b.String()
}

func TestMetricsDoc(t *testing.T) {
	var own, queue collected
	controller.NewMetrics(&own)
	controller.NewWorkqueueMetricsProvider(&queue)

	var b strings.Builder
	b.WriteString("# Metrics\n\n" + generatedNote + "\n")
	b.WriteString("`/metrics` (`--metrics-bind-address`, default `:8080`) serves these in Prometheus' text format. " +
		"The alerts and the dashboard that read them are in [operating](operating.md#alerts-and-a-dashboard).\n\n")
	b.WriteString("## The controller's\n\n")
	b.WriteString(own.table(t))
	b.WriteString("\n## The workqueue's\n\nclient-go's workqueue metrics, exported by the controller; the label `name` is " +
		"`student-controller`.\n\n")
	b.WriteString(queue.table(t))
	b.WriteString("\n## Libraries'\n\n" +
		"- `rest_client_*`: client-go's requests to the API server, by method, host and code, and their latency.\n" +
		"- `leader_election_master_status{name=\"student-controller\"}`: 1 on the replica that holds the Lease, 0 on a standby " +
		"(with `--leader-elect`).\n" +
		"- `process_*` and `go_*`: the process (resident memory, CPU, open files) and the Go runtime (heap, collections, " +
		"goroutines), from the Prometheus client.\n")
	golden(t, "../../docs/metrics.md", b.String())
}

// collected is a prometheus.Registerer that keeps what is registered with it, so that
// metrics without a sample yet can be described.
type collected struct{ collectors []prometheus.Collector }

func (c *collected) Register(col prometheus.Collector) error {
	c.collectors = append(c.collectors, col)
	return nil
}

func (c *collected) MustRegister(cols ...prometheus.Collector) {
	c.collectors = append(c.collectors, cols...)
}

func (c *collected) Unregister(prometheus.Collector) bool { return false }

// descFields reads a Desc's name, help and variable labels from its String form, the
// one place client_golang shows them.
var descFields = regexp.MustCompile(`^Desc\{fqName: "([^"]+)", help: "((?:[^"\\]|\\.)*)", (?:unit: "[^"]*", )?constLabels: \{[^}]*\}, variableLabels: \{([^}]*)\}\}$`)

func (c *collected) table(t *testing.T) string {
	t.Helper()
	type row struct{ name, kind, labels, help string }
	var rows []row
	for _, col := range c.collectors {
		ch := make(chan *prometheus.Desc, 1)
		col.Describe(ch)
		close(ch)
		desc := <-ch
		m := descFields.FindStringSubmatch(desc.String())
		if m == nil {
			t.Fatalf("cannot read %s: the Desc format of client_golang changed; update descFields", desc)
		}
		r := row{name: m[1], help: strings.ReplaceAll(m[2], `\"`, `"`)}
		if m[3] != "" {
			r.labels = "`" + strings.ReplaceAll(m[3], ",", "`, `") + "`"
		}
		switch col.(type) { // Gauge before Counter: a Gauge has a Counter's methods too
		case *prometheus.GaugeVec, prometheus.Gauge:
			r.kind = "gauge"
		case *prometheus.CounterVec, prometheus.Counter:
			r.kind = "counter"
		case *prometheus.HistogramVec, prometheus.Histogram:
			r.kind = "histogram"
		case prometheus.GaugeFunc: // last: every metric has a GaugeFunc's methods
			r.kind = "gauge"
		default:
			t.Fatalf("%s: a collector of type %T; name its kind here", r.name, col)
		}
		rows = append(rows, r)
	}
	slices.SortFunc(rows, func(a, b row) int { return strings.Compare(a.name, b.name) })
	var b strings.Builder
	b.WriteString("| metric | type | labels | what |\n|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", r.name, r.kind, r.labels, r.help)
	}
	return b.String()
}

// golden compares a rendered page with its file, or writes the file when UPDATE_DOCS
// is set.
func golden(t *testing.T, path, want string) {
	t.Helper()
	if os.Getenv("UPDATE_DOCS") != "" {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil { // #nosec G306 -- documentation, world-readable by design
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(path) // #nosec G304 -- a file of this repository
	if err != nil {
		t.Fatalf("%v: run make generate", err)
	}
	if diff := cmp.Diff(want, string(got)); diff != "" {
		t.Errorf("%s disagrees with the code; run make generate (-code +file):\n%s", path, diff)
	}
}
