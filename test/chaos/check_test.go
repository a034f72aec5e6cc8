package chaos

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
	"github.com/student-controller/student-controller/pkg/generated/clientset/versioned"
)

// The invariants, in the order the results list them.
const (
	invReady      = "every live Student Ready at its generation"
	invRow        = "every live Student's row matches it (uid, namespace, name, display name, school, owner, generation)"
	invUpdates    = "every accepted update in its object and row"
	invNotLost    = "no Student lost"
	invDeleted    = "every deleted Student gone, none Terminating"
	invDeletedRow = "every deleted Student's row deleted (Delete) or released (Orphan); released, whatever its policy, if an older backup put it back owned or it was deleted while the registry was behind"
	invNoOrphans  = "no owned row without a Student"
	invOthers     = "no other owner's row touched"
	invMonotonic  = "no row went back in generation"
	invHistory    = "every row write on record: each row's last history entry holds its values, a let-go row's says so, one creation per Student"
)

// invLogs names a data race only where one can show: in the log of a controller built
// with the race detector.
var invLogs = logsInvariant()

func logsInvariant() string {
	if raceControllers {
		return "no panic or data race in the controller's log"
	}
	return "no panic in the controller's log (built without the race detector)"
}

var invariants = []string{invReady, invRow, invUpdates, invNotLost, invDeleted, invDeletedRow, invNoOrphans, invOthers, invMonotonic, invHistory, invLogs}

// entry is the last history entry of a row, as the checker reads it.
type entry struct {
	action, studentName, school string
	generation                  int64
	created                     int // the row's "created" entries, of all
}

// readHistory reads, for each uid, its last history entry and how many times it was
// created.
func readHistory(ctx context.Context, db *sql.DB) (map[string]entry, error) {
	rows, err := db.QueryContext(ctx, `SELECT h.uid, h.action, COALESCE(h.student_name, ''), COALESCE(h.school, ''), COALESCE(h.generation, 0),
		(SELECT COUNT(*) FROM student_history c WHERE c.uid = h.uid AND c.action = 'created')
		FROM student_history h WHERE h.id = (SELECT MAX(id) FROM student_history l WHERE l.uid = h.uid)`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]entry{}
	for rows.Next() {
		var uid string
		var e entry
		if err := rows.Scan(&uid, &e.action, &e.studentName, &e.school, &e.generation, &e.created); err != nil {
			return nil, err
		}
		out[uid] = e
	}
	return out, rows.Err()
}

// row is one registry row as read by the checker, straight from the database: the
// checker shares no code with the controller's registry package.
type row struct {
	uid, namespace, name, studentName, school, owner string
	generation                                       int64
	updatedAt, releasedAt, releaseCause              string
}

const rowQuery = `SELECT uid, namespace, name, student_name, school, COALESCE(owner, ''), generation,
	COALESCE(CAST(updated_at AS TEXT), ''), COALESCE(CAST(released_at AS TEXT), ''), COALESCE(release_cause, '') FROM students`

func readRows(ctx context.Context, db *sql.DB) (map[string]row, error) {
	rows, err := db.QueryContext(ctx, rowQuery)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]row{}
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.uid, &r.namespace, &r.name, &r.studentName, &r.school, &r.owner, &r.generation, &r.updatedAt, &r.releasedAt, &r.releaseCause); err != nil {
			return nil, err
		}
		out[r.uid] = r
	}
	return out, rows.Err()
}

// violations are what broke each invariant, a few examples each.
type violations map[string][]string

func (v violations) add(inv, format string, args ...any) {
	if len(v[inv]) < 5 {
		v[inv] = append(v[inv], fmt.Sprintf(format, args...))
	} else if len(v[inv]) == 5 {
		v[inv] = append(v[inv], "...")
	}
}

// checker checks the invariants against the API server and the registry.
type checker struct {
	client   versioned.Interface
	db       *database
	owner    string
	students func() []*student
	others   map[string]row // the other owner's rows as seeded
	watcher  *generationWatcher
	logs     func() []string
	// restored is what an older backup, put back, left of the deleted Students' rows;
	// nil until one is.
	restored *restoredRows
}

// check reads every Student and every row once and returns what breaks an invariant.
func (c *checker) check(ctx context.Context) (violations, error) {
	list, err := c.client.BolingcavalryV1().Students(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list Students: %w", err)
	}
	db := c.db.get()
	rows, err := readRows(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("read the registry: %w", err)
	}
	history, err := readHistory(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("read the registry's history: %w", err)
	}
	v := violations{}
	live := map[string]*studentv1.Student{} // by namespace/name
	liveUIDs := map[string]bool{}
	for i := range list.Items {
		s := &list.Items[i]
		live[s.Namespace+"/"+s.Name] = s
		if s.DeletionTimestamp != nil {
			v.add(invDeleted, "%s/%s Terminating since %s, finalizers %v", s.Namespace, s.Name, s.DeletionTimestamp.Format(time.RFC3339), s.Finalizers)
			continue
		}
		liveUIDs[string(s.UID)] = true
		ready := meta.FindStatusCondition(s.Status.Conditions, studentv1.ConditionReady)
		if ready == nil || ready.Status != metav1.ConditionTrue || s.Status.ObservedGeneration != s.Generation || ready.ObservedGeneration != s.Generation {
			v.add(invReady, "%s/%s generation %d: observedGeneration %d, Ready %v", s.Namespace, s.Name, s.Generation, s.Status.ObservedGeneration, ready)
		}
		r, ok := rows[string(s.UID)]
		want := row{uid: string(s.UID), namespace: s.Namespace, name: s.Name, studentName: s.Spec.Name, school: s.Spec.School, owner: c.owner, generation: s.Generation}
		switch {
		case !ok:
			v.add(invRow, "%s/%s (uid %s): no row", s.Namespace, s.Name, s.UID)
		case r.uid != want.uid || r.namespace != want.namespace || r.name != want.name || r.studentName != want.studentName ||
			r.school != want.school || r.owner != want.owner || r.generation != want.generation:
			v.add(invRow, "%s/%s: row %+v, want %+v", s.Namespace, s.Name, r.fields(), want.fields())
		}
	}

	for _, s := range c.students() {
		s.mu.Lock()
		uid, spec, deleted := string(s.uid), s.spec, s.deleted
		s.mu.Unlock()
		key := s.ns + "/" + s.name
		obj := live[key]
		r, hasRow := rows[uid]
		if uid == "" {
			continue // not created yet
		}
		c.checkHistory(v, key, uid, r, hasRow, deleted, history[uid])
		if deleted {
			if obj != nil && obj.DeletionTimestamp == nil {
				v.add(invDeleted, "%s: deleted, still there", key)
			}
			switch {
			case c.restored != nil && c.restored.ownedWithoutStudent[uid]:
				// Its row came back with the backup, owned, its Student gone for good:
				// absence releases it (once an operator confirms), never deletes it.
				if !hasRow || r.owner != "" || r.releasedAt == "" {
					v.add(invDeletedRow, "%s (%s): deleted before an older backup was put back with its row owned: want the row released, have %+v (row: %v)",
						key, s.policy, r.fields(), hasRow)
				}
				continue
			case c.restored != nil && c.restored.lost[uid]:
				// The backup did not hold its row: the restore lost it, not the controller.
				if hasRow && (r.owner != "" || r.releasedAt == "") {
					v.add(invDeletedRow, "%s (Orphan): its row was not in the backup put back, yet the registry has it owned: %+v", key, r.fields())
				}
				continue
			}
			switch {
			case s.policy == studentv1.DeletionPolicyDelete && hasRow && r.owner == "" && r.releaseCause == "registry-behind":
				// Deleted while the registry was behind the cluster's mark: released, for
				// registry prune once the restore is confirmed; nothing destroyed on it.
			case s.policy == studentv1.DeletionPolicyDelete && hasRow:
				v.add(invDeletedRow, "%s (Delete): row still there, owner %q", key, r.owner)
			case s.policy == studentv1.DeletionPolicyOrphan && !hasRow:
				v.add(invDeletedRow, "%s (Orphan): no row", key)
			case s.policy == studentv1.DeletionPolicyOrphan && (r.owner != "" || r.releasedAt == ""):
				v.add(invDeletedRow, "%s (Orphan): row not released: owner %q, released at %q", key, r.owner, r.releasedAt)
			}
			continue
		}
		if obj == nil || string(obj.UID) != uid {
			v.add(invNotLost, "%s (uid %s): not found", key, uid)
			continue
		}
		if spec.Management == "" {
			spec.Management = studentv1.ManagementManage // the CRD's default, which the loader does not set
		}
		if obj.Spec != spec {
			v.add(invUpdates, "%s: object spec %+v, accepted %+v", key, obj.Spec, spec)
		} else if hasRow && (r.studentName != spec.Name || r.school != spec.School) {
			v.add(invUpdates, "%s: row has %q/%q, accepted %q/%q", key, r.studentName, r.school, spec.Name, spec.School)
		}
	}

	for uid, r := range rows {
		if r.owner == c.owner && !liveUIDs[uid] {
			v.add(invNoOrphans, "row %s (%s/%s) owned, no live Student", uid, r.namespace, r.name)
		}
	}
	for uid, want := range c.others {
		if got, ok := rows[uid]; !ok || got != want {
			v.add(invOthers, "row %s: now %+v, was %+v", uid, got, want)
		}
	}
	for _, problem := range c.watcher.problems() {
		v.add(invMonotonic, "%s", problem)
	}
	for _, line := range c.logs() {
		v.add(invLogs, "%s", line)
	}
	return v, nil
}

// checkHistory checks the history of one Student's row against the row: a write
// without its history entry leaves the last entry behind the row, a history entry
// without its write (a rolled-back write recorded anyway) puts it ahead.
func (c *checker) checkHistory(v violations, key, uid string, r row, hasRow, deleted bool, last entry) {
	switch {
	case last.action == "":
		if hasRow {
			v.add(invHistory, "%s (uid %s): a row, no history", key, uid)
		}
		return
	case last.created > 1:
		v.add(invHistory, "%s: created %d times", key, last.created)
	}
	switch {
	case !hasRow:
		if !deleted || last.action != "deleted" {
			v.add(invHistory, "%s: no row, the history ends with %q (deleted: %v)", key, last.action, deleted)
		}
	case r.owner == "":
		if last.action != "released" {
			v.add(invHistory, "%s: row released, the history ends with %q", key, last.action)
		}
	case r.owner == c.owner:
		if last.action == "deleted" || last.action == "released" || last.studentName != r.studentName || last.school != r.school ||
			last.generation != r.generation {
			v.add(invHistory, "%s: row %q/%q at generation %d, the history ends with %s %q/%q at %d", key,
				r.studentName, r.school, r.generation, last.action, last.studentName, last.school, last.generation)
		}
	}
}

func (r row) fields() string {
	return fmt.Sprintf("{uid:%s ns:%s name:%s display:%q school:%q owner:%q generation:%d}", r.uid, r.namespace, r.name, r.studentName, r.school, r.owner, r.generation)
}

// generationWatcher reads the registry over and over while the run goes on and
// remembers any row whose generation went down from one read to a later one.
type generationWatcher struct {
	db *database

	mu    sync.Mutex
	max   map[string]int64
	found []string
	reads int
	// paused: the registry is being put back from a backup (pause, resume); epoch
	// changes with each, so that a read begun before one is not compared after it.
	paused bool
	epoch  int
}

func (w *generationWatcher) run(ctx context.Context, every time.Duration) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
		w.mu.Lock()
		paused, epoch := w.paused, w.epoch
		w.mu.Unlock()
		if paused {
			continue
		}
		rows, err := readRows(ctx, w.db.get())
		if err != nil {
			continue // the registry is down: a fault, or the end
		}
		w.mu.Lock()
		if w.epoch != epoch {
			w.mu.Unlock()
			continue
		}
		w.reads++
		if w.max == nil {
			w.max = map[string]int64{}
		}
		for uid, r := range rows {
			if prev, ok := w.max[uid]; ok && r.generation < prev {
				w.found = append(w.found, fmt.Sprintf("row %s (%s/%s) went from generation %d to %d", uid, r.namespace, r.name, prev, r.generation))
			}
			w.max[uid] = max(w.max[uid], r.generation)
		}
		w.mu.Unlock()
	}
}

// pause stops the watcher looking while the registry is put back from a backup, whose
// rows go back in generation as they should.
func (w *generationWatcher) pause() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.paused = true
	w.epoch++
}

// resume starts the watcher again from the registry as it now is.
func (w *generationWatcher) resume() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.paused = false
	w.max = nil
	w.epoch++
}

// count says how many times the watcher has read the registry.
func (w *generationWatcher) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.reads
}

func (w *generationWatcher) problems() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := append([]string(nil), w.found...)
	sort.Strings(out)
	return out
}
