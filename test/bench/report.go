package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

type report struct {
	Date    string `json:"date"`
	Machine string `json:"machine"`
	// Build is the commit the contenders were built from (git describe --always --dirty).
	Build        string `json:"build,omitempty"`
	N            int    `json:"n"`
	PhaseTimeout string `json:"phaseTimeout"`
	// PeerDeleteTimeout bounds the peer's delete phase when it is shorter than
	// PhaseTimeout.
	PeerDeleteTimeout string    `json:"peerDeleteTimeout,omitempty"`
	Results           []*result `json:"results"`
	// Sweeps time one sweep of student-controller over N rows, on each database.
	Sweeps []sweepResult `json:"sweeps,omitempty"`
	// Skipped are the contenders left out of a scale run, and why.
	Skipped []skipped `json:"skipped,omitempty"`
}

type skipped struct {
	Name string `json:"name"`
	Why  string `json:"why"`
}

func writeResults(dir string, n int, phase phases, rev, goVersion string, results []*result, sweeps []sweepResult, left []skipped) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	floors := map[string]*result{}
	for _, r := range results {
		floors[r.Name] = r
	}
	for _, r := range results {
		if f := floors[floorTwoWrites]; f != nil && f.ProjectedSeconds > 0 {
			r.RatioToFloor = r.ProjectedSeconds / f.ProjectedSeconds
		}
		if f := floors[floorStatusOnly]; f != nil && f.ProjectedSeconds > 0 {
			r.RatioToStatusFloor = r.ProjectedSeconds / f.ProjectedSeconds
		}
	}
	rep := report{Date: time.Now().UTC().Format(time.RFC3339), Machine: machine(goVersion), Build: rev, N: n, PhaseTimeout: phase.all.String(), Results: results, Sweeps: sweeps, Skipped: left}
	if phase.peerDelete < phase.all {
		rep.PeerDeleteTimeout = phase.peerDelete.String()
	}
	return render(dir, rep)
}

// base reads the results at N = targetN beside a scale run's: its targets are growth
// from there.
func base(dir string, n int) (*report, error) {
	if n <= targetN {
		return nil, nil
	}
	b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("n%d.json", targetN)))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var rep report
	if err := json.Unmarshal(b, &rep); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, fmt.Sprintf("n%d.json", targetN)), err)
	}
	return &rep, nil
}

// rerender rewrites the Markdown and the chart of a results JSON, for a change to how
// results are shown that needs no new measurement.
func rerender(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var rep report
	if err := json.Unmarshal(b, &rep); err != nil {
		return err
	}
	return render(filepath.Dir(path), rep)
}

func render(dir string, rep report) error {
	n := rep.N
	from, err := base(dir, n)
	if err != nil {
		return err
	}
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	name := fmt.Sprintf("n%d", n)
	if err := os.WriteFile(filepath.Join(dir, name+".json"), js, 0o644); err != nil {
		return err
	}
	md := markdown(rep, from)
	// What was learned from this run beyond its figures (profiles, logs) is written by
	// hand beside it, not compiled into the bench.
	if _, err := os.Stat(filepath.Join(dir, name+"-notes.md")); err == nil {
		md += fmt.Sprintf("\nNotes written by hand on runs at this N (each says which run and build it describes): [%s-notes.md](%s-notes.md).\n", name, name)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".md"), []byte(md), 0o644); err != nil {
		return err
	}
	if err := chart(filepath.Join(dir, name+".png"), rep); err != nil {
		return err
	}
	say("results in %s/%s.{md,json,png}", dir, name)
	return nil
}

func markdown(rep report, from *report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Benchmark: N = %d Students\n\n", rep.N)
	built := ""
	if rep.Build != "" {
		built = ", build " + rep.Build
	}
	fmt.Fprintf(&b, "Run %s on %s%s. Each contender in turn: a fresh namespace, an empty registry, the same loader "+
		"(32 goroutines, no client rate limit) and the same control plane. A phase that runs past %s is cut off; "+
		"its converge time is then projected from the rate reached (marked *projected*)%s.\n\n", rep.Date, rep.Machine, built, rep.PhaseTimeout, deleteCut(rep))
	b.WriteString("| contender | converge (all Ready, rows present) | × floor | × status-only floor | API requests / Student | Student writes / Student | Events / Student | create to Ready: p50, p99, max | CPU to converge | peak RSS | steady RSS | restart: time, writes | delete all |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rep.Results {
		conv := fmt.Sprintf("%.1f s", r.ConvergeSeconds)
		if !r.Converged {
			conv = fmt.Sprintf("%.0f s *projected* (%d/%d Ready at %.0f s)", r.ProjectedSeconds, r.ReadyAtCutoff, r.N, r.ConvergeSeconds)
		}
		restart := "–"
		if r.RestartMeasured {
			restart = fmt.Sprintf("%.1f s, %d", r.RestartSeconds, r.RestartWrites)
		} else if r.Converged && r.Name != floorTwoWrites && r.Name != floorStatusOnly && r.Name != floorStatusOnlyCBOR {
			restart = fmt.Sprintf("not done in %.0f s", r.RestartSeconds)
		}
		del := fmt.Sprintf("%.1f s", r.DeleteSeconds)
		if !r.DeleteDone {
			del = fmt.Sprintf("cut off at %.0f s, %d left", r.DeleteSeconds, r.DeleteLeft)
		}
		cpu := "–" // results from before it was measured
		if r.ConvergeCPUSeconds > 0 {
			cpu = fmt.Sprintf("%.1f s", r.ConvergeCPUSeconds)
		}
		statusFloor := "–" // results from before it was measured
		if r.RatioToStatusFloor > 0 {
			statusFloor = fmt.Sprintf("%.2f", r.RatioToStatusFloor)
		}
		floor := "–" // not run
		if r.RatioToFloor > 0 {
			floor = fmt.Sprintf("%.2f", r.RatioToFloor)
		}
		latency := "–" // results from before it was measured
		if r.LatencyMaxSeconds > 0 {
			latency = fmt.Sprintf("%.2f s, %.2f s, %.2f s", r.LatencyP50Seconds, r.LatencyP99Seconds, r.LatencyMaxSeconds)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %.2f | %.2f | %s | %s | %.1f MiB | %.1f MiB | %s | %s |\n",
			r.Name, conv, floor, statusFloor, methods(r.RequestsPerStudent), r.WritesPerStudent, r.EventsPerStudent, latency, cpu, r.PeakRSSMiB, r.SteadyRSSMiB, restart, del)
	}
	b.WriteString("\nContenders:\n\n")
	for _, r := range rep.Results {
		fmt.Fprintf(&b, "- **%s**: %s\n", r.Name, r.Describe)
	}
	b.WriteString("\nAPI requests are the contender's own (client-go's `rest_client_requests_total`), Events included; " +
		"GET counts the initial list and watches. CPU is the contender process's user and system time from its start " +
		"until 3 s after converging; memory is its resident set (`VmHWM`, `VmRSS`) with N Students cached, at the same moment. " +
		"Create to Ready is each Student's wait, from the watch event of its create to the first that shows it Ready, " +
		"as the bench's own watch sees them (to the millisecond); under a bulk load of N at once it is mostly queueing.\n")
	var putTimes []string
	for _, r := range rep.Results {
		if r.StatusPUTServerMs > 0 {
			putTimes = append(putTimes, fmt.Sprintf("%s %.1f ms", r.Name, r.StatusPUTServerMs))
		}
	}
	if len(putTimes) > 0 {
		b.WriteString("\nkube-apiserver's own mean time to answer a status PUT of a Student over the converge " +
			"(its `apiserver_request_duration_seconds`): " + strings.Join(putTimes, ", ") + ".\n")
	}
	var machine []string
	for _, r := range rep.Results {
		if r.MachineBusyCores > 0 {
			machine = append(machine, fmt.Sprintf("%s %.2f cores busy, %.1f s stolen", r.Name, r.MachineBusyCores, r.StealSeconds))
		}
	}
	if len(machine) > 0 {
		b.WriteString("\nThe whole machine over each converge (/proc/stat: every process's CPU, and the time the " +
			"hypervisor gave this VM's CPUs to others): " + strings.Join(machine, "; ") + ".\n")
	}
	b.WriteString("\n![Ready Students over time](" + fmt.Sprintf("n%d.png", rep.N) + ")\n")
	if len(rep.Skipped) > 0 {
		b.WriteString("\nNot run at this N:\n\n")
		for _, s := range rep.Skipped {
			fmt.Fprintf(&b, "- **%s**: %s", s.Name, s.Why)
			if from != nil {
				for _, r := range from.Results {
					if r.Name == s.Name && !r.Converged && r.ProjectedSeconds > 0 {
						fmt.Fprintf(&b, ". At N = %d it was cut off and projected at %.0f s; at its pace N = %d would take about %.0f s (%.1f hours)",
							from.N, r.ProjectedSeconds, rep.N, r.ProjectedSeconds*float64(rep.N)/float64(from.N), r.ProjectedSeconds*float64(rep.N)/float64(from.N)/3600)
					}
				}
			}
			b.WriteString("\n")
		}
	}
	b.WriteString(sweepTable(rep))
	b.WriteString(historyTable(rep))
	b.WriteString(bytesTable(rep))
	if from != nil {
		b.WriteString(scaleTargets(rep, from))
	} else {
		b.WriteString(targets(rep))
	}
	return b.String()
}

// targets checks student-controller's results against the targets it is held to.
func targets(rep report) string {
	by := byName(rep)
	sc, noPolicy, orig, peer := by["student-controller"], by["student-controller-no-policy"], by["original-settings"], by["controller-runtime"]
	if sc == nil || noPolicy == nil || orig == nil || peer == nil || by[floorTwoWrites] == nil || by[floorStatusOnly] == nil {
		return ""
	}
	var b strings.Builder
	b.WriteString("\n## Targets for student-controller\n\n")
	if rep.N != targetN {
		fmt.Fprintf(&b, "The targets are set for N = %d. This run has N = %d, where a second or two shifts the ratios: "+
			"read it as a check that the benchmark works.\n\n", targetN, rep.N)
	}
	b.WriteString("| target | result | met |\n|---|---|---|\n")
	row := func(target, result string, met bool) {
		fmt.Fprintf(&b, "| %s | %s | %s |\n", target, result, map[bool]string{true: "yes", false: "**no**"}[met])
	}
	row("as shipped: converge within 1.15× the status-only floor", fmt.Sprintf("%.2f×", sc.RatioToStatusFloor), sc.Converged && sc.RatioToStatusFloor <= 1.15)
	row("as shipped: converge in at most 0.6× the two-write floor", fmt.Sprintf("%.2f×", sc.RatioToFloor), sc.Converged && sc.RatioToFloor <= 0.6)
	row("as shipped: 1.00 API writes per new Student, Events included", writesWithEvents(sc), sc.WritesPerStudent+sc.EventsPerStudent < 1.005)
	row("as shipped: 0 writes on restart", fmt.Sprintf("%d", sc.RestartWrites), sc.RestartMeasured && sc.RestartWrites == 0)
	row("without the policy: converge within 1.15× the two-write floor", fmt.Sprintf("%.2f×", noPolicy.RatioToFloor), noPolicy.Converged && noPolicy.RatioToFloor <= 1.15)
	row("without the policy: 0 writes on restart", fmt.Sprintf("%d", noPolicy.RestartWrites), noPolicy.RestartMeasured && noPolicy.RestartWrites == 0)
	speedup := orig.ProjectedSeconds / sc.ProjectedSeconds
	row("at least 10× faster than the original settings", fmt.Sprintf("%.0f× (%s)", speedup, map[bool]string{true: "measured", false: "against the projected time"}[orig.Converged]), speedup >= 10)
	row("faster than the controller-runtime peer", fmt.Sprintf("%.1f s against %.1f s (%.1f×)", sc.ProjectedSeconds, peer.ProjectedSeconds, peer.ProjectedSeconds/sc.ProjectedSeconds), sc.ProjectedSeconds < peer.ProjectedSeconds)
	memRatio := sc.SteadyRSSMiB / peer.SteadyRSSMiB
	row("steady memory at most 60% of the peer's", fmt.Sprintf("%.1f MiB against %.1f MiB (%.0f%%)", sc.SteadyRSSMiB, peer.SteadyRSSMiB, memRatio*100), memRatio <= 0.6)
	if statusFloor := by[floorStatusOnly]; sc.RatioToFloor > 0.6 && statusFloor.RatioToFloor > 0.6 {
		fmt.Fprintf(&b, "\nMissed: converging in 0.6× the two-write floor, by %.2f×. The status-only floor itself, which makes "+
			"nothing but the one write, takes %.2f× here: halving the writes does not halve the time, since the same "+
			"API server and etcd also take the loader's %d creates while the contenders write.\n",
			sc.RatioToFloor-0.6, statusFloor.RatioToFloor, rep.N)
	}
	switch line := 0.6 * peer.SteadyRSSMiB; {
	case sc.SteadyRSSMiB > line:
		fmt.Fprintf(&b, "\nMissed: steady memory, by %.1f MiB (the target is %.1f MiB).\n", sc.SteadyRSSMiB-line, line)
	case line-sc.SteadyRSSMiB < memorySpreadMiB:
		fmt.Fprintf(&b, "\nMet narrowly: steady memory is %.1f MiB under the target of %.1f MiB, less than runs of the same "+
			"build differ by (about %.0f MiB here), so a rerun can land above it.\n", line-sc.SteadyRSSMiB, line, memorySpreadMiB)
	}
	b.WriteString(eventsNote)
	return b.String()
}

const eventsNote = "\nEvents: student-controller sends none for a new Student or a deleted one, only for changes and " +
	"trouble (docs/design.md, Events), so a bulk import costs one write per Student and nothing beside it. The Events column " +
	"counts every Event a contender posted while converging.\n"

func writesWithEvents(r *result) string {
	return fmt.Sprintf("%.2f (%.2f Student writes, %.2f Events)", r.WritesPerStudent+r.EventsPerStudent, r.WritesPerStudent, r.EventsPerStudent)
}

// scaleTargets checks a scale run against the targets set for it: ratios within the run,
// and growth from the results at N = targetN.
func scaleTargets(rep report, from *report) string {
	now, was := map[string]*result{}, map[string]*result{}
	for _, r := range rep.Results {
		now[r.Name] = r
	}
	for _, r := range from.Results {
		was[r.Name] = r
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n## Targets at N = %d\n\nGrowth is from the results at N = %d ([n%d.md](n%d.md), run %s, the same "+
		"machine): %.0f× the Students.\n\n", rep.N, from.N, from.N, from.N, from.Date, float64(rep.N)/float64(from.N))
	sc, peer, floor := now["student-controller"], now["controller-runtime"], now[floorStatusOnly]
	sc0, peer0, floor0 := was["student-controller"], was["controller-runtime"], was[floorStatusOnly]
	if sc == nil || peer == nil || floor == nil || sc0 == nil || peer0 == nil || floor0 == nil {
		b.WriteString("Not checked: the targets need student-controller, controller-runtime and floor-status-only in both runs.\n")
		return b.String()
	}
	b.WriteString("| target | result | met |\n|---|---|---|\n")
	row := func(target, result string, met bool) {
		fmt.Fprintf(&b, "| %s | %s | %s |\n", target, result, map[bool]string{true: "yes", false: "**no**"}[met])
	}
	row("as shipped: converge within 1.2× the status-only floor", fmt.Sprintf("%.2f×", sc.RatioToStatusFloor), sc.Converged && sc.RatioToStatusFloor <= 1.2)
	row("as shipped: 0 writes on restart", fmt.Sprintf("%d", sc.RestartWrites), sc.RestartMeasured && sc.RestartWrites == 0)
	row("as shipped: 1.00 API writes per new Student, Events included", writesWithEvents(sc), sc.WritesPerStudent+sc.EventsPerStudent < 1.005)
	added := float64(rep.N - from.N)
	ours, theirs := sc.SteadyRSSMiB-sc0.SteadyRSSMiB, peer.SteadyRSSMiB-peer0.SteadyRSSMiB
	perStudent := ours * 1024 / added
	row(fmt.Sprintf("steady memory grows at most %.1f KiB per added Student", growthKiBPerStudent), fmt.Sprintf("%.2f KiB (%.1f → %.1f MiB)", perStudent, sc0.SteadyRSSMiB, sc.SteadyRSSMiB), perStudent <= growthKiBPerStudent)
	share := "the peer did not grow"
	if theirs > 0 {
		share = fmt.Sprintf("%.0f%% (%.1f MiB against the peer's %.1f MiB, %.1f → %.1f)", ours/theirs*100, ours, theirs, peer0.SteadyRSSMiB, peer.SteadyRSSMiB)
	}
	row(fmt.Sprintf("steady memory grows at most %.0f%% of the peer's growth", growthShareOfPeer*100), share, theirs > 0 && ours <= growthShareOfPeer*theirs)
	growth := func(a, b float64) float64 {
		if b <= 0 {
			return 0
		}
		return a / b
	}
	linear := func(what string, ours, floors, slack float64, measured bool) {
		target := fmt.Sprintf("%s grows no more than the status-only floor's", what)
		if slack > 1 {
			target += fmt.Sprintf(" + %.0f%%", (slack-1)*100)
		}
		value := fmt.Sprintf("%.2f× against %.2f×", ours, floors)
		if !measured {
			value += " (a phase was cut off)"
		}
		row(target, value, measured && ours > 0 && ours <= floors*slack)
	}
	deletesDone := sc.DeleteDone && sc0.DeleteDone && floor.DeleteDone && floor0.DeleteDone
	linear("converge time", growth(sc.ProjectedSeconds, sc0.ProjectedSeconds), growth(floor.ProjectedSeconds, floor0.ProjectedSeconds), growthSlack, true)
	linear("CPU to converge", growth(sc.ConvergeCPUSeconds, sc0.ConvergeCPUSeconds), growth(floor.ConvergeCPUSeconds, floor0.ConvergeCPUSeconds), 1, true)
	linear("delete-all time", growth(sc.DeleteSeconds, sc0.DeleteSeconds), growth(floor.DeleteSeconds, floor0.DeleteSeconds), growthSlack, deletesDone)
	restart := growth(sc.RestartSeconds, sc0.RestartSeconds)
	row(fmt.Sprintf("restart time grows no faster than the Students (%.0f×; the floors do not restart)", float64(rep.N)/float64(from.N)),
		fmt.Sprintf("%.1f× (%.1f → %.1f s)", restart, sc0.RestartSeconds, sc.RestartSeconds), restart > 0 && restart <= float64(rep.N)/float64(from.N))

	if sc.RatioToStatusFloor > 1.2 {
		fmt.Fprintf(&b, "\nMissed: converging within 1.2× the status-only floor, by %.2f×.\n", sc.RatioToStatusFloor-1.2)
	}
	convergeGrowth, deleteGrowth := growth(sc.ProjectedSeconds, sc0.ProjectedSeconds), growth(sc.DeleteSeconds, sc0.DeleteSeconds)
	floorConverge, floorDelete := growth(floor.ProjectedSeconds, floor0.ProjectedSeconds), growth(floor.DeleteSeconds, floor0.DeleteSeconds)
	if convergeGrowth > floorConverge*growthSlack || deleteGrowth > floorDelete*growthSlack || !deletesDone {
		fmt.Fprintf(&b, "\nMissed: growing no more than the floor + %.0f%%. Against the status-only floor of the same run, "+
			"student-controller's converge time was %.2f× at N = %d and %.2f× here, its delete-all time %.2f× and %.2f×. "+
			"At N = %d a second or two either way moves the ratio by several hundredths.\n",
			(growthSlack-1)*100, sc0.ProjectedSeconds/floor0.ProjectedSeconds, from.N, sc.ProjectedSeconds/floor.ProjectedSeconds, sc0.DeleteSeconds/floor0.DeleteSeconds, sc.DeleteSeconds/floor.DeleteSeconds, from.N)
	}
	if perStudent > growthKiBPerStudent || (theirs > 0 && ours > growthShareOfPeer*theirs) {
		b.WriteString("\nMissed: memory that scales.")
		if perStudent > growthKiBPerStudent {
			fmt.Fprintf(&b, " Steady memory grows %.2f KiB per added Student, %.2f KiB over the target.", perStudent, perStudent-growthKiBPerStudent)
		}
		if theirs > 0 && ours > growthShareOfPeer*theirs {
			fmt.Fprintf(&b, " Its growth is %.0f%% of the peer's; the target is %.0f%%.", ours/theirs*100, growthShareOfPeer*100)
		}
		b.WriteString("\n")
	}

	fmt.Fprintf(&b, "\nGrowth of every contender run at both N (the floors show what the API server and etcd do with "+
		"%.0f× the Students: a floor that grows more than that is the API server and etcd bending):\n\n", float64(rep.N)/float64(from.N))
	b.WriteString("| contender | converge | CPU to converge | restart | delete all | steady RSS per 1000 added Students |\n|---|---|---|---|---|---|\n")
	for _, r := range rep.Results {
		r0 := was[r.Name]
		if r0 == nil {
			continue
		}
		restart := "–"
		if r.RestartMeasured && r0.RestartMeasured {
			restart = fmt.Sprintf("%.1f×", growth(r.RestartSeconds, r0.RestartSeconds))
		}
		del := "cut off"
		if r.DeleteDone && r0.DeleteDone {
			del = fmt.Sprintf("%.1f×", growth(r.DeleteSeconds, r0.DeleteSeconds))
		}
		fmt.Fprintf(&b, "| %s | %.1f× | %.1f× | %s | %s | %.2f MiB |\n", r.Name,
			growth(r.ProjectedSeconds, r0.ProjectedSeconds), growth(r.ConvergeCPUSeconds, r0.ConvergeCPUSeconds), restart,
			del, (r.SteadyRSSMiB-r0.SteadyRSSMiB)*1000/added)
	}
	b.WriteString(eventsNote)
	return b.String()
}

// The scale run's growth targets (issue 23): steady memory per added Student and as a
// share of the peer's growth, and how much more than the status-only floor's the
// converge and delete-all times may grow (a factor on the floor's growth).
const (
	growthKiBPerStudent = 0.7
	growthShareOfPeer   = 0.15
	growthSlack         = 1.05
)

// targetN is the number of Students the targets are set for.
const targetN = 10000

// memorySpreadMiB is how far under its target a steady memory counts as met narrowly:
// about what runs of one build differ by (bench/results/history.md).
const memorySpreadMiB = 2.0

func sweepTable(rep report) string {
	if len(rep.Sweeps) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n## One sweep over %d rows\n\n", rep.N)
	fmt.Fprintf(&b, "The sweep that student-controller runs every `--sweep-interval` (Controller.Sweep: list the rows it owns, "+
		"compare each with the cached Student), timed in-process over %d rows in line with %d cached Students, %d times "+
		"one after another. The rows are written first through the registry's upsert from 8 goroutines; PostgreSQL is "+
		"Debian's 15, started by the bench with fsync off, on the same machine.\n\n", rep.N, rep.N, sweepRuns)
	b.WriteString("| registry | rows | one sweep (median) | slowest | per 1000 rows | writing the rows |\n|---|---|---|---|---|---|\n")
	for _, s := range rep.Sweeps {
		fmt.Fprintf(&b, "| %s | %d | %.2f s | %.2f s | %.1f ms | %.1f s |\n", s.Registry, s.Rows, s.median(),
			slices.Max(s.Seconds), s.median()/float64(s.Rows)*1e6, s.FillSeconds)
	}
	return b.String()
}

// historyTable sets each registry's contender beside the same build without the
// history, when the run has both.
func historyTable(rep report) string {
	by := byName(rep)
	var b strings.Builder
	for _, pair := range []struct{ registry, with, without string }{
		{"SQLite", "student-controller", noHistory},
		{"PostgreSQL", onPostgres, onPostgresNoHistory},
	} {
		with, without := by[pair.with], by[pair.without]
		if with == nil || without == nil {
			continue
		}
		if b.Len() == 0 {
			b.WriteString("\n## What the history costs\n\n")
			b.WriteString("Each registry's contender beside the same build compiled without the history row " +
				"(`-tags bench_nohistory`; no shipped build leaves it out). With the history, each row write " +
				"inserts one more row in the same transaction: N on converging, N more on deleting all. The size is " +
				"the registry's once converged: the SQLite file's pages, or the PostgreSQL database's tables with their " +
				"indexes. CPU is the controller's own: on PostgreSQL the database's share of the work runs in its server and is not counted. " +
				"A pair that did not both converge (or finish deleting) shows \"–\". One run each: a difference of a second or two " +
				"in time is within what runs of one build differ by.\n\n")
			b.WriteString("| registry | converge: with, without | CPU to converge | delete all | history rows once converged | registry size per Student | history's share of the size |\n|---|---|---|---|---|---|---|\n")
		}
		// Only what both measured to the end is set side by side.
		seconds := func(w, wo float64, done bool) string {
			if !done || w <= 0 || wo <= 0 {
				return "–"
			}
			return fmt.Sprintf("%.1f s, %.1f s (%+.0f%%)", w, wo, (w/wo-1)*100)
		}
		converged := with.Converged && without.Converged
		size, share := "–", "–"
		if converged && with.RegistryBytes > 0 && without.RegistryBytes > 0 {
			size = fmt.Sprintf("%.0f B, %.0f B", float64(with.RegistryBytes)/float64(with.N), float64(without.RegistryBytes)/float64(without.N))
			share = fmt.Sprintf("%.0f%%", float64(with.RegistryBytes-without.RegistryBytes)/float64(with.RegistryBytes)*100)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %d, %d | %s | %s |\n", pair.registry,
			seconds(with.ConvergeSeconds, without.ConvergeSeconds, converged), seconds(with.ConvergeCPUSeconds, without.ConvergeCPUSeconds, converged),
			seconds(with.DeleteSeconds, without.DeleteSeconds, with.DeleteDone && without.DeleteDone), with.HistoryRows, without.HistoryRows,
			size, share)
	}
	return b.String()
}

// bytesTable sets the contenders that change how the bytes travel beside the ones
// they differ from, when the run has both: CBOR on both sides, and a watch not gzipped.
func bytesTable(rep report) string {
	by := byName(rep)
	var b strings.Builder
	for _, pair := range []struct{ change, base, other, baseFloor, otherFloor string }{
		{"CBOR, the controller", "student-controller", withCBOR, floorStatusOnly, floorStatusOnlyCBOR},
		{"CBOR, the status-only floor", floorStatusOnly, floorStatusOnlyCBOR, "", ""},
		{"the watch not gzipped (WatchListCompression off)", "student-controller", noWatchGzip, floorStatusOnly, floorStatusOnly},
	} {
		base, other := by[pair.base], by[pair.other]
		if base == nil || other == nil {
			continue
		}
		if b.Len() == 0 {
			b.WriteString("\n## CBOR, and the watch's gzip\n\n")
			b.WriteString("Each contender beside the one it differs from, in the same run. CBOR: kube-apiserver started " +
				"with `--feature-gates=CBORServingAndStorage=true` (custom resources served and stored as CBOR) and the " +
				"contender with `KUBE_FEATURE_ClientsAllowCBOR=true` and `KUBE_FEATURE_ClientsPreferCBOR=true` (its requests, " +
				"responses and watch in CBOR; the loader and the observer stay on JSON); all three gates are alpha in v1.37. " +
				"The watch not gzipped: kube-apiserver started with `--feature-gates=WatchListCompression=false`; by default it " +
				"gzips the whole watch that an informer opens with the initial list (every event after it too), on loopback " +
				"as anywhere. kube-apiserver's CPU is from the first Student created until converged. A pair that did not " +
				"both converge shows \"–\". One run each: a difference of a second or two is within what runs differ by.\n\n")
			b.WriteString("| change | converge: without, with | contender's CPU to converge | kube-apiserver's CPU to converge | × its status-only floor: without, with |\n|---|---|---|---|---|\n")
		}
		converged := base.Converged && other.Converged
		pct := func(w, wo float64) string {
			if !converged || w <= 0 || wo <= 0 {
				return "–"
			}
			return fmt.Sprintf("%.1f s, %.1f s (%+.0f%%)", wo, w, (w/wo-1)*100)
		}
		floors := "–"
		if bf, of := by[pair.baseFloor], by[pair.otherFloor]; converged && bf != nil && of != nil && bf.Converged && of.Converged {
			floors = fmt.Sprintf("%.2f, %.2f", base.ConvergeSeconds/bf.ConvergeSeconds, other.ConvergeSeconds/of.ConvergeSeconds)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", pair.change, pct(other.ConvergeSeconds, base.ConvergeSeconds),
			pct(other.ConvergeCPUSeconds, base.ConvergeCPUSeconds), pct(other.APIServerCPUSeconds, base.APIServerCPUSeconds), floors)
	}
	return b.String()
}

// byName is the run's results by contender.
func byName(rep report) map[string]*result {
	by := map[string]*result{}
	for _, r := range rep.Results {
		by[r.Name] = r
	}
	return by
}

func methods(m map[string]float64) string {
	var parts []string
	for _, k := range []string{"GET", "POST", "PUT", "PATCH", "DELETE"} {
		if v, ok := m[k]; ok {
			parts = append(parts, fmt.Sprintf("%s %.2f", k, v))
		}
	}
	return strings.Join(parts, ", ")
}

// revision names the commit the contenders are built from, "-dirty" when tracked files
// other than the results differ from it, and the version in its VERSION file; empty
// outside a git checkout.
func revision() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return ""
	}
	rev := strings.TrimSpace(string(out))
	changed, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)bench/results").Output()
	if err == nil && len(bytes.TrimSpace(changed)) > 0 {
		rev += "-dirty"
	}
	if v, err := os.ReadFile("VERSION"); err == nil {
		rev += " (version " + strings.TrimSpace(string(v)) + ")"
	}
	return rev
}

// machine describes the machine, and the Go release the contenders were built with.
func machine(goVersion string) string {
	model := "unknown CPU"
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
		_ = f.Close() // read only
	}
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int
		_, _ = fmt.Sscanf(strings.SplitN(string(b), "\n", 2)[0], "MemTotal: %d kB", &kb) // 0 GiB if it changes form
		mem = fmt.Sprintf(", %.0f GiB", float64(kb)/1024/1024)
	}
	return fmt.Sprintf("%d × %s%s, contenders built with %s, kube-apiserver v1.37.2 and etcd 3.7.0 from bin/k8s", runtime.NumCPU(), model, mem, goVersion)
}

// chart draws Ready Students over time, one line per contender.
func chart(path string, rep report) error {
	// The legend takes a line under the axis for every three contenders.
	const w, left, right, top = 960, 70, 20, 40
	bottom := 44 + 18*((len(rep.Results)+2)/3)
	h := 480 + bottom
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	draw.Draw(img, img.Bounds(), image.NewUniform(color.White), image.Point{}, draw.Src)
	colors := []color.RGBA{{31, 119, 180, 255}, {214, 39, 40, 255}, {44, 160, 44, 255}, {127, 127, 127, 255},
		{255, 127, 14, 255}, {148, 103, 189, 255}, {140, 86, 75, 255}, {227, 119, 194, 255}, {188, 189, 34, 255},
		{23, 190, 207, 255}}

	maxT := 1.0
	for _, r := range rep.Results {
		if n := len(r.Timeline); n > 0 {
			maxT = max(maxT, r.Timeline[n-1].Seconds)
		}
	}
	x := func(s float64) int { return left + int(s/maxT*float64(w-left-right)) }
	y := func(ready int) int { return h - bottom - int(float64(ready)/float64(rep.N)*float64(h-top-bottom)) }
	grey := color.RGBA{200, 200, 200, 255}
	black := color.RGBA{0, 0, 0, 255}
	for i := 0; i <= 4; i++ {
		line(img, left, y(rep.N*i/4), w-right, y(rep.N*i/4), grey)
		text(img, 5, y(rep.N*i/4)+4, fmt.Sprint(rep.N*i/4), black)
	}
	for i := 0; i <= 5; i++ {
		t := maxT * float64(i) / 5
		line(img, x(t), top, x(t), h-bottom, grey)
		text(img, x(t)-10, h-bottom+18, fmt.Sprintf("%.0fs", t), black)
	}
	line(img, left, h-bottom, w-right, h-bottom, black)
	line(img, left, top, left, h-bottom, black)
	text(img, left, 22, fmt.Sprintf("Ready Students over time, N = %d (seconds since the loader started)", rep.N), black)
	for i, r := range rep.Results {
		c := colors[i%len(colors)]
		for j := 1; j < len(r.Timeline); j++ {
			a, b := r.Timeline[j-1], r.Timeline[j]
			line(img, x(a.Seconds), y(a.Ready), x(b.Seconds), y(b.Ready), c)
			line(img, x(a.Seconds), y(a.Ready)+1, x(b.Seconds), y(b.Ready)+1, c)
		}
		lx, ly := left+10+(i%3)*300, h-bottom+44+(i/3)*18 // three to a row
		line(img, lx, ly-4, lx+20, ly-4, c)
		line(img, lx, ly-3, lx+20, ly-3, c)
		text(img, lx+26, ly, r.Name, black)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return png.Encode(f, img)
}

func line(img *image.RGBA, x0, y0, x1, y1 int, c color.Color) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := sign(x1-x0), sign(y1-y0)
	e := dx + dy
	for {
		img.Set(x0, y0, c)
		if x0 == x1 && y0 == y1 {
			return
		}
		e2 := 2 * e
		if e2 >= dy {
			e += dy
			x0 += sx
		}
		if e2 <= dx {
			e += dx
			y0 += sy
		}
	}
}

func abs(v int) int  { return max(v, -v) }
func sign(v int) int { return map[bool]int{true: 1, false: -1}[v >= 0] }

func text(img *image.RGBA, x, y int, s string, c color.Color) {
	d := font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}

// deleteCut is what the report says of the peer's delete phase when it is bounded more
// tightly than the others (-peer-delete-timeout), or "".
func deleteCut(rep report) string {
	if rep.PeerDeleteTimeout == "" {
		return ""
	}
	return "; " + peer + "'s delete phase is cut off past " + rep.PeerDeleteTimeout + " (no target reads it), and its time then says how long it ran and how many Students were left"
}
