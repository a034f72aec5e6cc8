package main

import (
	"context"
	"errors"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/student-controller/student-controller/internal/registry"
)

// openReadOnly opens the registry for plan: read-only, neither migrated nor bound, and
// refused when it binds the owner to another cluster than kubeClient reaches. A
// registry with no schema yet holds no rows (noSchema). It tries once.
func openReadOnly(ctx context.Context, opts options, kubeClient kubernetes.Interface) (rows readOnlyRegistry, cluster string, closeRegistry func() error, err error) {
	if cluster, err = clusterID(ctx, kubeClient); err != nil {
		return nil, "", nil, err
	}
	r, err := registry.OpenURL(ctx, opts.registry, registry.Options{ReadOnly: true, Password: opts.registryPassword(), MaxOpenConns: opts.maxOpenConns})
	if errors.Is(err, registry.ErrNoSchema) {
		return noSchema{display: opts.registry.String()}, cluster, func() error { return nil }, nil
	}
	if err != nil {
		return nil, "", nil, err
	}
	if err := r.CheckBinding(ctx, opts.owner, cluster); err != nil {
		return nil, "", nil, errors.Join(err, r.Close())
	}
	return r, cluster, r.Close, nil
}

// readOnlyRegistry is what a plan reads of the registry.
type readOnlyRegistry interface {
	Get(ctx context.Context, uid string) (registry.Record, error)
	List(ctx context.Context, owner string) ([]registry.Record, []registry.MalformedRow, error)
	CheckSchema(ctx context.Context) error
	String() string
}

// noSchema is a registry without a schema yet (a new database, a SQLite file not yet
// made): it holds no rows, and the controller makes the schema when it first starts.
type noSchema struct{ display string }

func (noSchema) Get(context.Context, string) (registry.Record, error) {
	return registry.Record{}, registry.ErrNotFound
}

func (noSchema) List(context.Context, string) ([]registry.Record, []registry.MalformedRow, error) {
	return nil, nil, nil
}

func (noSchema) CheckSchema(context.Context) error { return nil }

func (n noSchema) String() string { return n.display + " (no schema yet)" }

// clusterID names the cluster a client reaches: the UID of its kube-system namespace,
// which lives as long as the cluster does.
func clusterID(ctx context.Context, client kubernetes.Interface) (string, error) {
	ns, err := client.CoreV1().Namespaces().Get(ctx, metav1.NamespaceSystem, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("read the cluster's identity (the UID of namespace kube-system): %w", err)
	}
	return string(ns.UID), nil
}
