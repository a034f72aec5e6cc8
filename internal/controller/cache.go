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

// cachedStudent is what the cache keeps of a Student for as long as it exists: the
// fields the controller reads, in a third of the memory of the object as decoded
// (BenchmarkCachedStudent). compact makes it, as the informer's transform; a sync
// turns it back into a Student with those fields (student) and builds its writes from
// that. The API server keeps only .status of a status write (a PUT of /status) and the
// finalizers of the finalizer write (a merge patch), and checks the resourceVersion of
// both, so what the cache leaves out (labels, other annotations, owner references,
// managed fields) is never written back.
//
// What most Students share is kept once: the school as an interned string, the
// deletion policy as flag bits, the conditions and the registry facts as unique handles
// (Students written in the same second share them). What few Students have (a deletion
// timestamp, other finalizers, a reconcile request, a UID or resourceVersion of another
// form than the API server's, a deletion policy of no known kind) is behind one
// pointer, nil for the others.
type cachedStudent struct {
	// key is namespace/name, the cache's key and the queue's; the namespace is its
	// first nsLen bytes.
	key   string
	nsLen int32
	flags cachedFlags
	// uid is the UID when it is a UUID as the API server makes them (zero: rare.uid),
	// resourceVersion the resourceVersion when it is a decimal number (zero:
	// rare.resourceVersion).
	uid             uuid.UUID
	resourceVersion uint64
	generation      int64

	// studentName and school are spec.name and spec.school (interned); spec.deletionPolicy
	// is in flags (cachedDelete, cachedOrphan) or rare.deletionPolicy (spec).
	studentName        string
	school             string
	observedGeneration int64
	conditions         unique.Handle[conditionSet]  // zero: none, or rare.conditions
	registry           unique.Handle[registryFacts] // zero: status.registry unset

	rare *rareFields
}

type cachedFlags uint8

const (
	// paused: the paused annotation is "true".
	cachedPaused cachedFlags = 1 << iota
	// ownFinalizerOnly: the finalizers are the controller's alone (rare.finalizers
	// holds any others).
	cachedOwnFinalizerOnly
	// cachedDelete, cachedOrphan: spec.deletionPolicy is Delete, Orphan. Neither: it is
	// empty or rare.deletionPolicy.
	cachedDelete
	cachedOrphan
	// cachedManage, cachedObserve: spec.management is Manage, Observe. Neither: it is
	// empty or rare.management.
	cachedManage
	cachedObserve
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

// conditionSet is a status's conditions when there are at most two (Ready, and Synced
// while paused), in their order.
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

// compact is the informer's transform: it makes a Student into what the cache keeps.
// Anything else passes through untouched, and so does a cachedStudent (a resync hands
// the cache's own objects back).
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

// compactIDs keeps uid and resourceVersion rv as numbers where they are in their
// usual form (a UUID, a decimal), as strings in rare otherwise.
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

// compactStatus keeps status's conditions, shared with other Students' where they are
// the same, and what it says of the registry row.
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

// student is the Student that c was made from, with the fields that the cache keeps,
// as a new object that the caller may change.
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
	if c.conditions != (unique.Handle[conditionSet]{}) {
		set := c.conditions.Value()
		s.Status.Conditions = slices.Clone(set.c[:set.n])
	}
	if c.registry != (unique.Handle[registryFacts]{}) {
		facts := c.registry.Value()
		s.Status.Registry = &studentv1.RegistryStatus{Owner: facts.owner, WrittenGeneration: facts.generation}
		if facts.hasWritten {
			s.Status.Registry.LastWrittenTime = &metav1.Time{Time: facts.written}
		}
	}
	if r := c.rare; r != nil {
		s.DeletionTimestamp = r.deletionTimestamp.DeepCopy()
		if r.reconcileRequestedAt != "" {
			if s.Annotations == nil {
				s.Annotations = map[string]string{}
			}
			s.Annotations[studentv1.AnnotationReconcileRequestedAt] = r.reconcileRequestedAt
		}
		if r.rowUID != "" {
			if s.Annotations == nil {
				s.Annotations = map[string]string{}
			}
			s.Annotations[studentv1.AnnotationRowUID] = r.rowUID
		}
		s.Status.LastHandledReconcileAt = r.lastHandledReconcileAt
		if r.conditions != nil {
			s.Status.Conditions = slices.Clone(r.conditions)
		}
	}
	return s
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

// deleting says whether the Student has a deletion timestamp.
func (c *cachedStudent) deleting() bool { return c.rareField().deletionTimestamp != nil }

// facts are what the decision reads of the Student, from the cache.
func (c *cachedStudent) facts() decide.Student {
	return decide.Student{Namespace: c.namespace(), Name: c.name(), UID: string(c.uidValue()), Generation: c.generation,
		Spec: c.spec(), RowKey: c.rowUID(), Deleting: c.deleting(), Paused: c.isPaused()}
}

// rowUID is the uid of the Student's registry row: its row-uid annotation, or its own
// uid (RowUID says the same of a Student).
func (c *cachedStudent) rowUID() string {
	if row := c.rareField().rowUID; row != "" {
		return row
	}
	return string(c.uidValue())
}

// spec is the Student's spec.
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

// isObserved says whether spec.management is Observe.
func (c *cachedStudent) isObserved() bool { return c.flags&cachedObserve != 0 }

// finalizers are the Student's finalizers, not to be changed.
func (c *cachedStudent) finalizers() []string {
	if c.flags&cachedOwnFinalizerOnly != 0 {
		return ownFinalizerOnly
	}
	return c.rareField().finalizers
}

var ownFinalizerOnly = []string{Finalizer}

// isPaused says whether the paused annotation holds the Student still.
func (c *cachedStudent) isPaused() bool { return c.flags&cachedPaused != 0 }

// cacheKey is the cache's key function: namespace/name, for the cache's objects, the
// Students that the watch brings before they are made compact, and tombstones.
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
