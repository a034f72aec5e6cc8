package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Student is a student whose record the student-controller keeps in the student
// registry: the object is the desired state, the registry row the actual state.
// Two annotations steer the controller: bolingcavalry.k8s.io/paused: "true" holds the
// Student still (no registry write, its deletion waits; status shows a Synced=False
// condition, reason Paused), and a new value of
// bolingcavalry.k8s.io/reconcile-requested-at asks for a sync now, one that reads the
// row from the registry; status.lastHandledReconcileAt then holds that value.
//
// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=stu,categories=school
// +kubebuilder:metadata:annotations="api-approved.kubernetes.io=unapproved, the student-controller sample API"
// +kubebuilder:metadata:annotations="argocd.argoproj.io/sync-options=Prune=false,Delete=false"
// +kubebuilder:metadata:annotations="kustomize.toolkit.fluxcd.io/prune=disabled"
// +kubebuilder:printcolumn:name="Display Name",type=string,JSONPath=`.spec.name`,description="The student's display name"
// +kubebuilder:printcolumn:name="School",type=string,JSONPath=`.spec.school`,description="The school the student attends"
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`,description="Whether the registry row matches the spec"
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1,description="Why the student is or is not ready"
// +kubebuilder:printcolumn:name="Policy",type=string,JSONPath=`.spec.deletionPolicy`,priority=1,description="What happens to the registry row on delete"
// +kubebuilder:printcolumn:name="Management",type=string,JSONPath=`.spec.management`,priority=1,description="Manage: the controller writes the row; Observe: it only compares"
// +kubebuilder:printcolumn:name="Drifted",type=string,JSONPath=`.status.conditions[?(@.type=="Drifted")].status`,priority=1,description="Whether an observed Student's registry row differs from its spec"
// +kubebuilder:printcolumn:name="Sync",type=string,JSONPath=`.status.conditions[?(@.type=="Synced")].reason`,priority=1,description="Paused while the paused annotation holds the Student still"
// +kubebuilder:printcolumn:name="Last Written",type=date,JSONPath=`.status.registry.lastWrittenTime`,priority=1,description="When the registry row was last written"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Student struct {
	metav1.TypeMeta `json:",inline"`
	// Standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the student as they should appear in the registry.
	// +required
	Spec StudentSpec `json:"spec"`

	// Status is what the controller last observed and wrote.
	// +optional
	Status StudentStatus `json:"status,omitempty"`
}

// StudentSpec is the desired registry record of a student.
type StudentSpec struct {
	// Name is the student's display name, in any script (for example "张三"). It is
	// written to the registry's student_name column. 1 to 128 characters, not blank,
	// no control characters (U+0000 to U+001F, U+007F), which a registry cannot hold
	// (NUL) or shows as nothing.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:XValidation:rule="self.trim().size() > 0",message="must not be blank"
	// +kubebuilder:validation:XValidation:rule="!self.matches('[[:cntrl:]]')",message="must not hold control characters (U+0000 to U+001F, U+007F)"
	Name string `json:"name"`

	// School is the school the student attends (for example "深圳中学"). 1 to 256
	// characters, not blank, no control characters (U+0000 to U+001F, U+007F).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:XValidation:rule="self.trim().size() > 0",message="must not be blank"
	// +kubebuilder:validation:XValidation:rule="!self.matches('[[:cntrl:]]')",message="must not hold control characters (U+0000 to U+001F, U+007F)"
	School string `json:"school"`

	// DeletionPolicy says what happens to the registry row when the Student is
	// deleted: Delete (the default) removes the row; Orphan keeps it and releases it,
	// so the controller no longer owns or changes it.
	// +optional
	// +kubebuilder:default=Delete
	DeletionPolicy DeletionPolicy `json:"deletionPolicy,omitempty"`

	// Management says what the controller does with the registry row: Manage (the
	// default) writes it to follow this spec and lets it go on delete; Observe never
	// writes, releases or deletes it, and only compares it with this spec: status shows
	// the Drifted condition. Switch to Manage to bring the row in line (one write).
	// Students that `student-controller registry adopt` makes from existing rows start
	// observed.
	// +optional
	// +kubebuilder:default=Manage
	Management Management `json:"management,omitempty"`
}

// Management says whether the controller writes a Student's registry row or only
// observes it.
// +kubebuilder:validation:Enum=Manage;Observe
type Management string

const (
	// ManagementManage: the controller writes the row to follow the spec.
	ManagementManage Management = "Manage"
	// ManagementObserve: the controller reads the row and reports how it differs from
	// the spec (the Drifted condition), and never changes it.
	ManagementObserve Management = "Observe"
)

// DeletionPolicy says what happens to a Student's registry row when the Student is
// deleted.
// +kubebuilder:validation:Enum=Delete;Orphan
type DeletionPolicy string

const (
	// DeletionPolicyDelete removes the registry row together with the Student.
	DeletionPolicyDelete DeletionPolicy = "Delete"
	// DeletionPolicyOrphan keeps the registry row, released from the controller.
	DeletionPolicyOrphan DeletionPolicy = "Orphan"
)

// StudentStatus is what the controller observed and did for a Student.
type StudentStatus struct {
	// ObservedGeneration is the metadata.generation that this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions are the latest observations of the Student's state. Ready summarises
	// them: True when the registry row matches the spec.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`

	// Registry describes the student's row in the registry, once it has been written.
	// +optional
	Registry *RegistryStatus `json:"registry,omitempty"`

	// LastHandledReconcileAt is the value of the bolingcavalry.k8s.io/reconcile-requested-at
	// annotation that the controller last handled: it synced the Student after reading
	// its row from the registry. Set the annotation to a new value (a time, a counter)
	// and wait for this field to show it.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	LastHandledReconcileAt string `json:"lastHandledReconcileAt,omitempty"`
}

// RegistryStatus describes a Student's row in the student registry.
type RegistryStatus struct {
	// Owner is the controller instance that owns the row (its --registry-owner).
	// +optional
	Owner string `json:"owner,omitempty"`

	// LastWrittenTime is when the controller last wrote the row.
	// +optional
	LastWrittenTime *metav1.Time `json:"lastWrittenTime,omitempty"`

	// WrittenGeneration is the metadata.generation of the spec last written to the row.
	// +optional
	WrittenGeneration int64 `json:"writtenGeneration,omitempty"`
}

// FinalizerRegistryRow is the controller's finalizer: it holds a Student until the
// Student's registry row is deleted or released. The admission policy of
// config/admission adds it when a Student is created.
const FinalizerRegistryRow = "bolingcavalry.k8s.io/registry-row"

// The annotations by which an operator steers the controller for one Student.
const (
	// AnnotationPaused, set to "true", holds the Student still: the controller writes
	// neither its registry row nor its status beyond a Synced=False condition with
	// reason Paused, and its deletion waits (Terminating) until the annotation is
	// removed or set to anything else. The row can be repaired by hand meanwhile.
	AnnotationPaused = "bolingcavalry.k8s.io/paused"
	// AnnotationReconcileRequestedAt asks for a sync now whenever its value changes
	// (any token: a time, a counter). That sync reads the row from the registry and
	// records the value in status.lastHandledReconcileAt.
	AnnotationReconcileRequestedAt = "bolingcavalry.k8s.io/reconcile-requested-at"
	// AnnotationRowUID names the registry row of a Student whose row has a key of its
	// own: a row that `student-controller registry adopt` bound to the Student it
	// made keeps the uid another system inserted it with, so that system goes on
	// writing it by that key. The row records the Student's uid in turn; a Student
	// that names a row bound to another Student is refused (RowNotBound). Without it,
	// the row's uid is the Student's. Never remove or change it.
	AnnotationRowUID = "bolingcavalry.k8s.io/row-uid"
)

// The condition types and reasons that the controller reports on a Student.
const (
	// ConditionReady summarises the Student: True when its registry row matches the spec.
	ConditionReady = "Ready"
	// ConditionSynced is present only while the Student is paused: False, with reason
	// ReasonPaused. Ready then still says what the controller last saw.
	ConditionSynced = "Synced"
	// ConditionDrifted is present only while spec.management is Observe: True, with
	// reason ReasonDrifted and what differs, when the registry row differs from the spec;
	// False, with reason ReasonInLine, when it matches.
	ConditionDrifted = "Drifted"

	// ReasonSynced: the registry row matches the spec.
	ReasonSynced = "Synced"
	// ReasonRegistryUnavailable: the registry could not be reached or refused the write.
	ReasonRegistryUnavailable = "RegistryUnavailable"
	// ReasonRowOwnedElsewhere: the registry row belongs to another controller instance.
	ReasonRowOwnedElsewhere = "RowOwnedElsewhere"
	// ReasonInvalidSpec: the spec cannot be written to the registry.
	ReasonInvalidSpec = "InvalidSpec"
	// ReasonDeleting: the Student is being deleted and its row is being removed or released.
	ReasonDeleting = "Deleting"
	// ReasonPaused: the paused annotation holds the Student still.
	ReasonPaused = "Paused"
	// ReasonRegistryAhead: the registry row holds a newer generation than the Student,
	// and the controller did not take it back (more rows were ahead than it takes back
	// on its own).
	ReasonRegistryAhead = "RegistryAhead"
	// ReasonDrifted: an observed Student's registry row differs from its spec (or is
	// missing); the controller does not write it.
	ReasonDrifted = "Drifted"
	// ReasonInLine: an observed Student's registry row matches its spec.
	ReasonInLine = "InLine"
	// ReasonRowReleased: this controller released the Student's registry row (an etcd
	// restore brought the Student back after its deletion), and did not take it back:
	// it has taken back as many rows as it does on its own (--registry-max-rewinds).
	ReasonRowReleased = "RowReleased"
	// ReasonRowDeleted: the Student's registry row was deleted (its history says so:
	// this Student's finalizer ran, in a cluster that went on without this copy of
	// it), and this controller did not write it again: it has undone as many rows as
	// it does on its own (--registry-max-rewinds).
	ReasonRowDeleted = "RowDeleted"
	// ReasonRowNotBound: the Student names a registry row (its row-uid annotation)
	// that is bound to another Student, or to none: the annotation was copied or set
	// by hand. The controller neither writes nor lets go of that row for it.
	ReasonRowNotBound = "RowNotBound"
)

// StudentList is a list of Students.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
type StudentList struct {
	metav1.TypeMeta `json:",inline"`
	// Standard list metadata.
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`

	// Items are the Students.
	Items []Student `json:"items"`
}
