// Package registry is the student registry: the table of student records that the
// controller keeps in line with the Student objects, over database/sql. It knows
// nothing of Kubernetes.
package registry
