package controller

import (
	"slices"
	"strconv"
	"time"
	"unique"

	"github.com/google/uuid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/student-controller/student-controller/internal/decide"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// cachedStudent is what the cache keeps of a Student: the fields the controller reads, in
// a third of the decoded memory (BenchmarkCachedStudent). A sync turns it back into a
// Student (student) to build its writes. What it leaves out is never written back: the
// status write keeps only .status, the finalizer patch only the finalizers, and both check
// the resourceVersion. Shared values are kept once; what few Students have is in rare.
type cachedStudent struct {
	// key is namespace/name, the cache's and queue's key; nsLen is the namespace's length.
	key   string
	nsLen int32
	flags cachedFlags
	// uid and resourceVersion hold the usual forms (a UUID, a decimal); zero: see rare.
	uid             uuid.UUID
	resourceVersion uint64
	generation      int64

	// studentName and school are spec.name and spec.school (interned).
	studentName        string
	school             string
	observedGeneration int64
	conditions         unique.Handle[conditionSet]  // zero: none, or rare.conditions
	registry           unique.Handle[registryFacts] // zero: status.registry unset

	rare *rareFields
}

type cachedFlags uint8

const (
	cachedPaused           cachedFlags = 1 << iota // the paused annotation is "true"
	cachedOwnFinalizerOnly                         // the finalizers are the controller's alone (else rare.finalizers)
	cachedDelete                                   // deletionPolicy is Delete (neither this nor cachedOrphan: "" or rare)
	cachedOrphan                                   // deletionPolicy is Orphan
	cachedManage                                   // management is Manage (neither this nor cachedObserve: "" or rare)
	cachedObserve                                  // management is Observe
)

// rareFields are the fields that few Students have.
type rareFields struct {
	deletionPolicy         studentv1.DeletionPolicy // neither Delete, Orphan nor empty
	management             studentv1.Management     // neither Manage, Observe nor empty
	uid                    types.UID
	resourceVersion        string
	deletionTimestamp      *metav1.Time
	finalizers             []string
	reconcileRequestedAt   string
	rowUID                 string // the row-uid annotation, where it is not the uid
	lastHandledReconcileAt string
	conditions             []metav1.Condition // more than a conditionSet holds
}

// conditionSet holds at most two conditions (Ready, and Synced while paused), in order.
type conditionSet struct {
	n int
	c [2]metav1.Condition
}

// registryFacts are status.registry.
type registryFacts struct {
	owner      string
	written    time.Time
	hasWritten bool
	generation int64
}

// compact is the informer's transform. Anything else passes through, as does a
// cachedStudent (a resync hands it back).
func compact(obj any) (any, error) {
	s, ok := obj.(*studentv1.Student)
	if !ok || s == nil {
		return obj, nil
	}
	return compactStudent(s), nil
}

// compactStudent is what the cache keeps of s.
func compactStudent(s *studentv1.Student) *cachedStudent {
	c := &cachedStudent{
		key:                cache.MetaObjectToName(s).String(), // as cache.MetaNamespaceKeyFunc makes it
		nsLen:              int32(len(s.Namespace)),            // #nosec G115 -- a namespace is at most 63 bytes
		generation:         s.Generation,
		studentName:        s.Spec.Name,
		school:             intern(s.Spec.School),
		observedGeneration: s.Status.ObservedGeneration,
	}
	var rare rareFields
	switch p := s.Spec.DeletionPolicy; p {
	case "":
	case studentv1.DeletionPolicyDelete:
		c.flags |= cachedDelete
	case studentv1.DeletionPolicyOrphan:
		c.flags |= cachedOrphan
	default:
		rare.deletionPolicy = p
	}
	switch m := s.Spec.Management; m {
	case "":
	case studentv1.ManagementManage:
		c.flags |= cachedManage
	case studentv1.ManagementObserve:
		c.flags |= cachedObserve
	default:
		rare.management = m
	}
	c.compactIDs(s.UID, s.ResourceVersion, &rare)
	rare.deletionTimestamp = s.DeletionTimestamp.DeepCopy()
	switch {
	case len(s.Finalizers) == 1 && s.Finalizers[0] == Finalizer:
		c.flags |= cachedOwnFinalizerOnly
	case len(s.Finalizers) > 0:
		rare.finalizers = make([]string, len(s.Finalizers))
		for i, f := range s.Finalizers {
			rare.finalizers[i] = intern(f)
		}
	}
	if paused(s) {
		c.flags |= cachedPaused
	}
	rare.reconcileRequestedAt = s.Annotations[studentv1.AnnotationReconcileRequestedAt]
	if row := s.Annotations[studentv1.AnnotationRowUID]; row != "" && row != string(s.UID) {
		rare.rowUID = row
	}
	rare.lastHandledReconcileAt = s.Status.LastHandledReconcileAt
	c.compactStatus(&s.Status, &rare)
	if rare.held() {
		c.rare = &rare
	}
	return c
}

// compactIDs keeps uid and rv as numbers in their usual form, else as strings in rare.
func (c *cachedStudent) compactIDs(uid types.UID, rv string, rare *rareFields) {
	if u, err := uuid.Parse(string(uid)); err == nil && u != uuid.Nil && u.String() == string(uid) {
		c.uid = u
	} else {
		rare.uid = uid
	}
	if v, err := strconv.ParseUint(rv, 10, 64); err == nil && v != 0 && strconv.FormatUint(v, 10) == rv {
		c.resourceVersion = v
	} else {
		rare.resourceVersion = rv
	}
}

// held says whether r holds anything: most Students need no rareFields at all.
func (r *rareFields) held() bool {
	return r.deletionPolicy != "" || r.management != "" || r.uid != "" || r.resourceVersion != "" || r.deletionTimestamp != nil || r.finalizers != nil ||
		r.reconcileRequestedAt != "" || r.rowUID != "" || r.lastHandledReconcileAt != "" || r.conditions != nil
}

// compactStatus keeps status's conditions, shared where equal, and its registry facts.
func (c *cachedStudent) compactStatus(status *studentv1.StudentStatus, rare *rareFields) {
	switch conds := status.Conditions; {
	case len(conds) > len(conditionSet{}.c):
		rare.conditions = slices.Clone(conds)
	case len(conds) > 0:
		set := conditionSet{n: len(conds)}
		copy(set.c[:], conds)
		c.conditions = unique.Make(set)
	}
	if r := status.Registry; r != nil {
		facts := registryFacts{owner: r.Owner, generation: r.WrittenGeneration}
		if r.LastWrittenTime != nil {
			facts.written, facts.hasWritten = r.LastWrittenTime.Time, true
		}
		c.registry = unique.Make(facts)
	}
}

// student rebuilds the Student from c's fields, as a new object the caller may change.
func (c *cachedStudent) student() *studentv1.Student {
	s := &studentv1.Student{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:       c.namespace(),
			Name:            c.name(),
			UID:             c.uidValue(),
			ResourceVersion: c.resourceVersionValue(),
			Generation:      c.generation,
		},
		Spec:   c.spec(),
		Status: studentv1.StudentStatus{ObservedGeneration: c.observedGeneration},
	}
	s.Finalizers = slices.Clone(c.finalizers())
	if c.flags&cachedPaused != 0 {
		s.Annotations = map[string]string{studentv1.AnnotationPaused: "true"}
	}
	s.Status.Conditions = slices.Clone(c.statusConditions())
	if c.registry != (unique.Handle[registryFacts]{}) {
		facts := c.registry.Value()
		s.Status.Registry = &studentv1.RegistryStatus{Owner: facts.owner, WrittenGeneration: facts.generation}
		if facts.hasWritten {
			s.Status.Registry.LastWrittenTime = &metav1.Time{Time: facts.written}
		}
	}
	if r := c.rare; r != nil {
		s.DeletionTimestamp = r.deletionTimestamp.DeepCopy()
		annotate := func(key, value string) {
			if value == "" {
				return
			}
			if s.Annotations == nil {
				s.Annotations = map[string]string{}
			}
			s.Annotations[key] = value
		}
		annotate(studentv1.AnnotationReconcileRequestedAt, r.reconcileRequestedAt)
		annotate(studentv1.AnnotationRowUID, r.rowUID)
		s.Status.LastHandledReconcileAt = r.lastHandledReconcileAt
	}
	return s
}

// statusConditions are the status's conditions, not to be changed.
func (c *cachedStudent) statusConditions() []metav1.Condition {
	if c.conditions == (unique.Handle[conditionSet]{}) {
		return c.rareField().conditions
	}
	set := c.conditions.Value()
	return set.c[:set.n]
}

func (c *cachedStudent) namespace() string { return c.key[:c.nsLen] }

func (c *cachedStudent) name() string {
	if c.nsLen == 0 {
		return c.key // no namespace, no "/"
	}
	return c.key[c.nsLen+1:]
}

func (c *cachedStudent) uidValue() types.UID {
	if c.uid == uuid.Nil {
		return c.rareField().uid
	}
	return types.UID(c.uid.String())
}

func (c *cachedStudent) resourceVersionValue() string {
	if c.resourceVersion == 0 {
		return c.rareField().resourceVersion
	}
	return strconv.FormatUint(c.resourceVersion, 10)
}

// rareField is c.rare, or the zero fields (shared, not to be changed) when c has none.
func (c *cachedStudent) rareField() *rareFields {
	if c.rare == nil {
		return &noRareFields
	}
	return c.rare
}

var noRareFields rareFields

func (c *cachedStudent) deleting() bool { return c.rareField().deletionTimestamp != nil }

// facts are what the decision reads of the Student, from the cache.
func (c *cachedStudent) facts() decide.Student {
	return decide.Student{Namespace: c.namespace(), Name: c.name(), UID: string(c.uidValue()), Generation: c.generation,
		Spec: c.spec(), RowKey: c.rowUID(), Deleting: c.deleting(), Paused: c.isPaused()}
}

// rowUID is the uid of the Student's row: its row-uid annotation, else its uid (RowUID).
func (c *cachedStudent) rowUID() string {
	if row := c.rareField().rowUID; row != "" {
		return row
	}
	return string(c.uidValue())
}

func (c *cachedStudent) spec() studentv1.StudentSpec {
	spec := studentv1.StudentSpec{Name: c.studentName, School: c.school}
	switch {
	case c.flags&cachedDelete != 0:
		spec.DeletionPolicy = studentv1.DeletionPolicyDelete
	case c.flags&cachedOrphan != 0:
		spec.DeletionPolicy = studentv1.DeletionPolicyOrphan
	default:
		spec.DeletionPolicy = c.rareField().deletionPolicy
	}
	switch {
	case c.flags&cachedManage != 0:
		spec.Management = studentv1.ManagementManage
	case c.flags&cachedObserve != 0:
		spec.Management = studentv1.ManagementObserve
	default:
		spec.Management = c.rareField().management
	}
	return spec
}

func (c *cachedStudent) isObserved() bool { return c.flags&cachedObserve != 0 }

// finalizers are the Student's finalizers, not to be changed.
func (c *cachedStudent) finalizers() []string {
	if c.flags&cachedOwnFinalizerOnly != 0 {
		return ownFinalizerOnly
	}
	return c.rareField().finalizers
}

var ownFinalizerOnly = []string{Finalizer}

func (c *cachedStudent) isPaused() bool { return c.flags&cachedPaused != 0 }

// cacheKey is the cache's key function: namespace/name of any Student or tombstone.
func cacheKey(obj any) (string, error) {
	switch o := obj.(type) {
	case *cachedStudent:
		if o != nil {
			return o.key, nil
		}
	case cache.DeletedFinalStateUnknown:
		return o.Key, nil
	}
	return cache.MetaNamespaceKeyFunc(obj)
}

// intern returns the canonical copy of s.
func intern[S ~string](s S) S {
	if s == "" {
		return s
	}
	return unique.Make(s).Value()
}
