// Package controlplane starts a real control plane: etcd, kube-apiserver and
// kube-controller-manager built into bin/k8s by `make controlplane`, with the Student
// CRD installed. It runs the servers itself, so that each can be stopped and started
// again on the same data, certificates and keys: the integration, end-to-end and
// chaos tests, the bench and `make run` all run against it.
package controlplane
