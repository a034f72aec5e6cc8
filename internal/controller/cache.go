package controller

import (
	"unique"

	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// TrimForCache is the informer transform: it runs on every Student before the object
// enters the cache, where it stays for as long as the Student exists. It drops
// metadata.managedFields, which the controller never reads and which are a large part
// of each object, and makes the strings that many Students share (namespace,
// finalizers, school, the Ready condition, the registry owner) point at one copy
// instead of one copy per Student.
func TrimForCache(obj any) (any, error) {
	s, ok := obj.(*studentv1.Student)
	if !ok {
		return obj, nil
	}
	s.ManagedFields = nil
	s.Namespace = intern(s.Namespace)
	for i := range s.Finalizers {
		s.Finalizers[i] = intern(s.Finalizers[i])
	}
	s.Spec.School = intern(s.Spec.School)
	s.Spec.DeletionPolicy = intern(s.Spec.DeletionPolicy)
	for i := range s.Status.Conditions {
		c := &s.Status.Conditions[i]
		c.Type, c.Status, c.Reason, c.Message = intern(c.Type), intern(c.Status), intern(c.Reason), intern(c.Message)
	}
	if s.Status.Registry != nil {
		s.Status.Registry.Owner = intern(s.Status.Registry.Owner)
	}
	return s, nil
}

// intern returns the canonical copy of s.
func intern[S ~string](s S) S {
	if s == "" {
		return s
	}
	return unique.Make(s).Value()
}
