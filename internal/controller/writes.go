package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"go.opentelemetry.io/otel/trace"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/student-controller/student-controller/internal/registry"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
	"github.com/student-controller/student-controller/pkg/generated/clientset/versioned"
)

// writes is the one path by which the controller changes anything: registry rows, the
// Students (finalizer, status) and Events. Each write first asks Config.Leading (guard),
// and the registry fences every row write itself. The Controller holds no other handle
// that can write, so a new write cannot skip the check (TestWritesTakeOnePath).
type writes struct {
	registry Registry
	client   versioned.Interface
	recorder record.EventRecorder
	leading  Gate         // Config.Leading; nil means always
	tracer   trace.Tracer // Config.Tracer; nil traces nothing
}

// allowed is nil if Config.Leading lets this replica write; only guard and mayStart ask.
func (w *writes) allowed() error {
	if w.leading == nil {
		return nil
	}
	if err := w.leading.Check(); err != nil {
		return fmt.Errorf("%w: %v", ErrNotLeading, err)
	}
	return nil
}

// guard runs write if this replica may write now, and returns ErrNotLeading otherwise.
func guard[T any](w *writes, write func() (T, error)) (T, error) {
	if err := w.allowed(); err != nil {
		var zero T
		return zero, err
	}
	return write()
}

// apply makes one registry write.
func (w *writes) apply(ctx context.Context, op registry.Op) (registry.Result, error) {
	return guard(w, func() (registry.Result, error) { return w.registry.Apply(ctx, op) })
}

// setFinalizers patches only s's finalizers, with its resourceVersion so a changed Student
// conflicts. s is the cache's, which holds no labels or annotations to write back.
func (w *writes) setFinalizers(ctx context.Context, s *studentv1.Student) (*studentv1.Student, error) {
	if s.ResourceVersion == "" {
		// Unconditional, the patch would replace finalizers added since the read.
		return nil, fmt.Errorf("write the finalizers of %s/%s: no resourceVersion to make the write conditional on", s.Namespace, s.Name)
	}
	finalizers := s.Finalizers
	if finalizers == nil {
		finalizers = []string{} // none left is [], not null
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"finalizers": finalizers, "resourceVersion": s.ResourceVersion}})
	if err != nil {
		return nil, err
	}
	return guard(w, func() (*studentv1.Student, error) {
		return w.client.BolingcavalryV1().Students(s.Namespace).Patch(ctx, s.Name, types.MergePatchType, patch,
			metav1.PatchOptions{FieldManager: FieldManager})
	})
}

// updateStatus writes s's status: only .status is kept, and a changed Student conflicts.
func (w *writes) updateStatus(ctx context.Context, s *studentv1.Student) (*studentv1.Student, error) {
	return guard(w, func() (*studentv1.Student, error) {
		ctx, span := startSpan(ctx, w.tracer, SpanStatusWrite)
		out, err := w.client.BolingcavalryV1().Students(s.Namespace).UpdateStatus(ctx, s, metav1.UpdateOptions{FieldManager: FieldManager})
		endSpan(span, err)
		return out, err
	})
}

// event posts an Event on obj only if this replica may write (an Event is a write too), so
// one that follows a write done just before the gate closed is lost.
func (w *writes) event(obj runtime.Object, eventType, reason, message string) {
	_, _ = guard(w, func() (struct{}, error) {
		w.recorder.Event(obj, eventType, reason, message)
		return struct{}{}, nil
	})
}

// warn posts a Warning Event on obj.
func (w *writes) warn(obj runtime.Object, reason, message string) {
	w.event(obj, corev1.EventTypeWarning, reason, message)
}
