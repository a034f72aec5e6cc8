// Package e2e runs the Student controller against a real kube-apiserver and etcd and a
// real registry, and checks the state of the world it leaves.
package e2e
