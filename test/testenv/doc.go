// Package testenv starts the real control plane (kube-apiserver and etcd built into
// bin/k8s by `make controlplane`) for integration and end-to-end tests, with the Student
// CRD installed.
package testenv
