// Package integration holds tests that run against a real kube-apiserver and etcd.
package integration
