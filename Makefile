# The front door. Thin targets over hack/ scripts and the go command.

SHELL := /usr/bin/env bash
.SHELLFLAGS := -o errexit -o nounset -o pipefail -c

GO_TEST_FLAGS ?=

.PHONY: all
all: build

.PHONY: help
help: ## Show the targets.
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: generate
generate: ## Regenerate deepcopy, clientset, listers, informers, apply configurations and the CRD.
	hack/update-codegen.sh

.PHONY: verify
verify: ## Fail when generated code is stale, code is unformatted or go vet complains.
	hack/verify-codegen.sh
	@unformatted="$$(gofmt -l $$(go list -f '{{.Dir}}' ./...))"; \
	if [[ -n "$$unformatted" ]]; then echo "gofmt needed on:"; echo "$$unformatted"; exit 1; fi
	go vet ./...
	go mod tidy -diff
	cd hack/tools/controlplane && go mod tidy -diff

.PHONY: controlplane
controlplane: ## Build kube-apiserver and etcd into bin/k8s (minutes the first time, then cached).
	hack/build-controlplane.sh

.PHONY: build
build: ## Build the controller into bin/student-controller.
	go build -o bin/student-controller ./cmd/student-controller

.PHONY: test
test: controlplane ## Run every test: unit, integration against the real control plane, codegen checks.
	go test -race -timeout 30m $(GO_TEST_FLAGS) ./...
