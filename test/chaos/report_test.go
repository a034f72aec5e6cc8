package chaos

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// duration is a time.Duration that reads as "1.2s" in JSON.
type duration time.Duration

func (d duration) String() string {
	return time.Duration(d).Round(100 * time.Millisecond).String()
}

func (d duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// report is one `make chaos`: a run per registry.
type report struct {
	N        int          `json:"n"`
	Started  time.Time    `json:"started"`
	Finished time.Time    `json:"finished"`
	Runs     []*runResult `json:"runs"`
}

// runResult is the schedule on one registry.
type runResult struct {
	Registry        string            `json:"registry"`
	Took            duration          `json:"took"`
	Created         int               `json:"created"`
	Updates         int               `json:"updatesAccepted"`
	DeletedDelete   int               `json:"deletedWithDelete"`
	DeletedOrphan   int               `json:"deletedWithOrphan"`
	Live            int               `json:"live"`
	ControllerExits int               `json:"controllerExits"`
	GenerationReads int               `json:"registryReadsForGenerations"`
	Phases          []phaseResult     `json:"phases"`
	Final           []invariantResult `json:"final"`
}

// phaseResult is one bulk and its fault.
type phaseResult struct {
	Fault         string   `json:"fault"`
	Requests      opCounts `json:"requests"`
	StruckAt      duration `json:"struckAt"`
	Outage        duration `json:"outage"`
	Takeover      duration `json:"takeover,omitempty"`
	TakeoverLimit duration `json:"takeoverLimit,omitempty"`
	// Writing is how long after the leader stopped a replica held the registry's
	// write fence (it may write again).
	Writing duration `json:"fenceTakenAfter,omitempty"`
	// CloneRowWrites and CloneHeldFence are what the clone's controller did: nothing,
	// or the fence failed.
	CloneRowWrites int  `json:"cloneRowWrites,omitempty"`
	CloneHeldFence bool `json:"cloneHeldFence,omitempty"`
	CloneWaited    bool `json:"cloneWaited,omitempty"`
	// RowsToWriteBack, RowsToRelease and RowsLost are what a backup put back left:
	// live Students' rows missing or behind, rows owned of Students gone since, and
	// released rows of deleted Orphan Students that the backup did not hold.
	RowsToWriteBack int        `json:"restoredRowsToWriteBack,omitempty"`
	RowsToRelease   int        `json:"restoredRowsToRelease,omitempty"`
	RowsLost        int        `json:"restoredRowsLost,omitempty"`
	LoadTook        duration   `json:"loadTook"`
	Recovery        duration   `json:"recovery"`
	SinceStrike     duration   `json:"sinceStrike"`
	APIWrites       int        `json:"apiWritesDuringRecovery"`
	RowWrites       int        `json:"rowWritesDuringRecovery"`
	Held            bool       `json:"held"`
	Violations      violations `json:"violations,omitempty"`
}

type invariantResult struct {
	Invariant  string   `json:"invariant"`
	Held       bool     `json:"held"`
	Violations []string `json:"violations,omitempty"`
}

func finalResults(v violations) []invariantResult {
	var out []invariantResult
	for _, inv := range invariants {
		out = append(out, invariantResult{Invariant: inv, Held: len(v[inv]) == 0, Violations: v[inv]})
	}
	return out
}

func (r *runResult) tally(all []*student) {
	for _, s := range all {
		s.mu.Lock()
		if s.uid != "" {
			r.Created++
		}
		r.Updates += s.updates
		switch {
		case !s.deleted:
			r.Live++
		case s.policy == studentv1.DeletionPolicyOrphan:
			r.DeletedOrphan++
		default:
			r.DeletedDelete++
		}
		s.mu.Unlock()
	}
}

func (rep *report) markdown() string {
	var b strings.Builder
	command, built := fmt.Sprintf("make chaos CHAOS_N=%d", rep.N), "with"
	if !raceControllers {
		command, built = fmt.Sprintf("CHAOS_N=%d go test ./test/chaos", rep.N), "without"
	}
	fmt.Fprintf(&b, "# Chaos run, %s\n\n", rep.Started.Format("2006-01-02"))
	fmt.Fprintf(&b, "`%s` (test/chaos): %d Students per registry, %s to %s UTC, on a %d-CPU machine. "+
		"The harness runs etcd, kube-apiserver, PostgreSQL and two controller replicas (built %s `-race`, leader election, "+
		"Lease %v / renew %v / retry %v, registry fence lease %v) itself, and restarts each on the same data and certificates. A loader creates, updates "+
		"and deletes Students (one third Orphan, deletes one by one and by DeleteCollection), retrying through outages; each fault "+
		"strikes once a third of its bulk is done (two thirds for the backup put back). A replica that exits is started again after 1 s, as the kubelet would.\n\n",
		command, rep.N, rep.Started.Format("15:04"), rep.Finished.Format("15:04"), runtime.NumCPU(), built, leaseDuration, renewDeadline, retryPeriod, fenceLease)
	b.WriteString("Recovery is from the end of the bulk and the fault (whichever is later) until every invariant below held, checked every 0.5 s " +
		"over every Student and every row. During that time: the write requests to Students and their status that the API server answered (its metrics; the loader is done, so they are the controllers'), and the registry rows the controllers wrote (their metrics; a replica that restarts meanwhile counts from its restart).\n\n")
	for _, run := range rep.Runs {
		fmt.Fprintf(&b, "## %s\n\n", run.Registry)
		fmt.Fprintf(&b, "%v in all. %d Students created, %d updates accepted, %d deleted (%d Delete, %d Orphan), %d live at the end; "+
			"the replicas exited %d times (faults and lost Leases); the generation watcher read the registry %d times.\n\n",
			run.Took, run.Created, run.Updates, run.DeletedDelete+run.DeletedOrphan, run.DeletedDelete, run.DeletedOrphan, run.Live,
			run.ControllerExits, run.GenerationReads)
		b.WriteString("| # | Fault | Bulk (create/update/delete/batches) | Struck at | Down | New leader after | Fence taken after | Bulk took | Recovery | Student writes | Row writes | Invariants |\n")
		b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for i, ph := range run.Phases {
			takeover, writing := "-", "-"
			if ph.Takeover > 0 {
				takeover = fmt.Sprintf("%v (limit %v)", ph.Takeover, ph.TakeoverLimit)
			}
			if ph.Writing > 0 {
				writing = fmt.Sprintf("%v (limit %v)", ph.Writing, duration(writingLimit))
			}
			switch ph.Fault {
			case faultClone:
				writing = fmt.Sprintf("clone waited: %v, wrote %d rows", ph.CloneWaited, ph.CloneRowWrites)
			case faultRegistryRestored:
				writing = fmt.Sprintf("backup put back: %d rows to write back, %d to release, %d released rows lost", ph.RowsToWriteBack, ph.RowsToRelease, ph.RowsLost)
			}
			held := "all held"
			if !ph.Held {
				held = fmt.Sprintf("**not all held**: %v", ph.Violations)
			}
			fmt.Fprintf(&b, "| %d | %s | %d/%d/%d/%d (%d Students) | %v | %v | %s | %s | %v | %v | %d | %d | %s |\n",
				i+1, ph.Fault, ph.Requests.Creates, ph.Requests.Updates, ph.Requests.Deletes, ph.Requests.BatchDeletes, ph.Requests.BatchStudents,
				ph.StruckAt, ph.Outage, takeover, writing, ph.LoadTook, ph.Recovery, ph.APIWrites, ph.RowWrites, held)
		}
		b.WriteString("\nEnd state:\n\n")
		for _, inv := range run.Final {
			mark := "held"
			if !inv.Held {
				mark = fmt.Sprintf("**broken**: %s", strings.Join(inv.Violations, "; "))
			}
			fmt.Fprintf(&b, "- %s: %s\n", inv.Invariant, mark)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// write puts the report into dir as <date>.md and <date>.json.
func (rep *report) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	base := filepath.Join(dir, rep.Started.Format("2006-01-02"))
	data, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(base+".json", append(data, '\n'), 0o644); err != nil {
		return err
	}
	return os.WriteFile(base+".md", []byte(rep.markdown()), 0o644)
}
