package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
	"github.com/student-controller/student-controller/pkg/generated/clientset/versioned"
)

const (
	batchLabel = "chaos.student-controller.io/batch"
	// batchSize Students share a batch label and a namespace; a bulk delete takes a
	// whole batch with one DeleteCollection.
	batchSize = 10
)

var namespaces = []string{"chaos-a", "chaos-b", "chaos-c"}

// student is the loader's record of one Student: what it asked for and the API server
// accepted. Only the loader changes Students' specs, so the last accepted spec is what
// the object and its row must end with.
type student struct {
	index  int
	ns     string
	name   string
	batch  int
	policy studentv1.DeletionPolicy

	mu      sync.Mutex
	uid     types.UID
	spec    studentv1.StudentSpec
	updates int
	deleted bool
}

func newStudentRecord(i int) *student {
	batch := i / batchSize
	policy := studentv1.DeletionPolicyDelete
	if i%3 == 2 {
		policy = studentv1.DeletionPolicyOrphan
	}
	return &student{
		index: i, batch: batch, policy: policy,
		ns:   namespaces[batch%len(namespaces)],
		name: fmt.Sprintf("s-%05d", i),
		spec: studentv1.StudentSpec{Name: fmt.Sprintf("学生 %d", i), School: "深圳中学", DeletionPolicy: policy},
	}
}

// opKind is what an op does.
type opKind int

const (
	opCreate opKind = iota
	opUpdate
	opDelete
	opDeleteBatch
)

// op is one request of a bulk: for opDeleteBatch, members are the batch's Students.
type op struct {
	kind    opKind
	s       *student
	members []*student
}

// opCounts counts a bulk's requests by kind.
type opCounts struct {
	Creates       int `json:"creates"`
	Updates       int `json:"updates"`
	Deletes       int `json:"deletes"`
	BatchDeletes  int `json:"batchDeletes"`
	BatchStudents int `json:"studentsInBatchDeletes"`
}

// loader creates, updates and deletes Students through the API server, retrying each
// request through outages until the API server has accepted it.
type loader struct {
	client versioned.Interface
	all    []*student
	rnd    *rand.Rand
	done   atomic.Int64
	// running says a bulk is being sent: from start until run returns.
	running atomic.Bool
}

// plan makes a bulk: creates new Students, and updates and deletes (one by one and by
// whole batches) of Students that earlier bulks created and that are still live.
func (l *loader) plan(creates, updates, deletes, batches int) ([]op, opCounts) {
	var ops []op
	var counts opCounts
	first := len(l.all)
	var live []*student
	for _, s := range l.all {
		if !s.isDeleted() {
			live = append(live, s)
		}
	}
	taken := map[*student]bool{}

	// Whole batches, all of whose Students earlier bulks made.
	byBatch := map[int][]*student{}
	var batchIDs []int
	for _, s := range live {
		if (s.batch+1)*batchSize > first {
			continue // the batch is not complete yet
		}
		if byBatch[s.batch] == nil {
			batchIDs = append(batchIDs, s.batch)
		}
		byBatch[s.batch] = append(byBatch[s.batch], s)
	}
	l.rnd.Shuffle(len(batchIDs), func(i, j int) { batchIDs[i], batchIDs[j] = batchIDs[j], batchIDs[i] })
	for _, b := range batchIDs {
		members := byBatch[b]
		if counts.BatchDeletes == batches || len(taken)+len(members) > len(live)/3 {
			break // leave most live Students to update and delete one by one
		}
		for _, s := range members {
			taken[s] = true
		}
		ops = append(ops, op{kind: opDeleteBatch, s: members[0], members: members})
		counts.BatchDeletes++
		counts.BatchStudents += len(members)
	}

	l.rnd.Shuffle(len(live), func(i, j int) { live[i], live[j] = live[j], live[i] })
	for _, s := range live {
		if taken[s] {
			continue
		}
		switch {
		case counts.Deletes < deletes:
			ops = append(ops, op{kind: opDelete, s: s})
			counts.Deletes++
		case counts.Updates < updates:
			ops = append(ops, op{kind: opUpdate, s: s})
			counts.Updates++
		default:
			continue
		}
		taken[s] = true
	}
	for i := range creates {
		s := newStudentRecord(first + i)
		l.all = append(l.all, s)
		ops = append(ops, op{kind: opCreate, s: s})
		counts.Creates++
	}
	l.rnd.Shuffle(len(ops), func(i, j int) { ops[i], ops[j] = ops[j], ops[i] })
	return ops, counts
}

// start readies the loader for a bulk: nothing done, running. It is called before run
// goes off in the background, so that whoever waits for a share of the bulk to be done
// never reads the count of the bulk before.
func (l *loader) start() {
	l.done.Store(0)
	l.running.Store(true)
}

// run carries out ops with workers in parallel, after start; l.done counts those
// finished.
func (l *loader) run(ctx context.Context, ops []op, workers int) error {
	defer l.running.Store(false)
	work := make(chan op)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for o := range work {
				if err := l.do(ctx, o); err != nil {
					errs <- err
					return
				}
				l.done.Add(1)
			}
		}()
	}
	var err error
feed:
	for _, o := range ops {
		select {
		case work <- o:
		case err = <-errs:
			break feed
		}
	}
	close(work)
	wg.Wait()
	close(errs)
	return errors.Join(err, <-errs)
}

func (l *loader) do(ctx context.Context, o op) error {
	s := o.s
	students := l.client.BolingcavalryV1().Students(s.ns)
	switch o.kind {
	case opCreate:
		obj := &studentv1.Student{
			ObjectMeta: metav1.ObjectMeta{Name: s.name, Labels: map[string]string{batchLabel: strconv.Itoa(s.batch)}},
			Spec:       s.spec,
		}
		return retry(ctx, "create "+s.ns+"/"+s.name, func(ctx context.Context) error {
			created, err := students.Create(ctx, obj, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				// An earlier try reached the API server and its answer was lost.
				created, err = students.Get(ctx, s.name, metav1.GetOptions{})
			}
			if err == nil {
				s.mu.Lock()
				s.uid = created.UID
				s.mu.Unlock()
			}
			return err
		})
	case opUpdate:
		s.mu.Lock()
		want := s.spec
		want.Name = fmt.Sprintf("学生 %d v%d", s.index, s.updates+1)
		want.School = fmt.Sprintf("第%d中学", (s.index+s.updates)%7+1)
		s.mu.Unlock()
		return retry(ctx, "update "+s.ns+"/"+s.name, func(ctx context.Context) error {
			cur, err := students.Get(ctx, s.name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if cur.Spec != want {
				cur.Spec = want
				if _, err := students.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
					return err
				}
			}
			s.mu.Lock()
			s.spec, s.updates = want, s.updates+1
			s.mu.Unlock()
			return nil
		})
	case opDelete:
		s.mu.Lock()
		uid := s.uid
		s.mu.Unlock()
		return retry(ctx, "delete "+s.ns+"/"+s.name, func(ctx context.Context) error {
			err := students.Delete(ctx, s.name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
			if err == nil || apierrors.IsNotFound(err) {
				s.markDeleted()
				return nil
			}
			return err
		})
	case opDeleteBatch:
		selector := batchLabel + "=" + strconv.Itoa(s.batch)
		return retry(ctx, "delete batch "+selector, func(ctx context.Context) error {
			if err := students.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: selector}); err != nil {
				return err
			}
			for _, m := range o.members {
				m.markDeleted()
			}
			return nil
		})
	}
	return fmt.Errorf("unknown op %d", o.kind)
}

func (s *student) markDeleted() {
	s.mu.Lock()
	s.deleted = true
	s.mu.Unlock()
}

func (s *student) isDeleted() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deleted
}

// retry calls f, each call limited to 15 s, until it succeeds; through outages, for up
// to 5 minutes. An answer that no retry can change (invalid, forbidden) ends it.
func retry(ctx context.Context, what string, f func(context.Context) error) error {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		callCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
		err := f(callCtx)
		cancel()
		switch {
		case err == nil:
			return nil
		case apierrors.IsInvalid(err) || apierrors.IsForbidden(err) || apierrors.IsBadRequest(err):
			return fmt.Errorf("%s: %w", what, err)
		case ctx.Err() != nil:
			return fmt.Errorf("%s: %w", what, ctx.Err())
		case time.Now().After(deadline):
			return fmt.Errorf("%s: still failing after 5 minutes: %w", what, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
