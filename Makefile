# The front door. Thin targets over hack/ scripts and the go command.

SHELL := /usr/bin/env bash
.SHELLFLAGS := -o errexit -o nounset -o pipefail -c

# The Go toolchain every target builds and tests with: the newest 1.26 patch release,
# which the go command fetches from the Go module proxy when the machine has an older
# one (go.mod's toolchain line says the same, for machines that follow it). Its fixes
# to the standard library are what keep govulncheck clean.
GOTOOLCHAIN ?= go1.26.11
export GOTOOLCHAIN

# The build tags of the shipped controller (make build, make image; the tests' and the
# bench's builds take the same from ctrlbin.ShippedTags, and a test checks the two
# agree). grpcnotrace: grpc, linked for OTLP traces, leaves out golang.org/x/net/trace,
# whose html/template would keep the linker from dropping any exported method
# (bench/results/history.md has what it cost).
GO_TAGS := grpcnotrace

# Every build but the race detector's is static, as make build and the image ship the
# controller (only net and os/user would use cgo): go vet, the docs test, the control
# plane, the lint tools and the tests' controller binaries then share each compiled
# package, where cgo on and off would compile client-go and the rest twice.
export CGO_ENABLED := 0

GO_TEST_FLAGS ?=

.PHONY: all
all: build

.PHONY: help
help: ## Show the targets.
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: generate
generate: ## Regenerate deepcopy, clientset, listers, informers, apply configurations, the CRD and docs/flags.md, docs/metrics.md.
	hack/update-codegen.sh
	UPDATE_DOCS=1 go test -trimpath -tags $(GO_TAGS) -count=1 -run '^Test(Flags|Metrics)Doc$$' ./cmd/student-controller

.PHONY: verify
verify: ## Fail when generated code is stale, code is unformatted or go vet complains (make test and make check fail on stale docs/flags.md and docs/metrics.md).
	hack/verify-codegen.sh
	@unformatted="$$(gofmt -l $$(go list -f '{{.Dir}}' ./...))"; \
	if [[ -n "$$unformatted" ]]; then echo "gofmt needed on:"; echo "$$unformatted"; exit 1; fi
	@# -trimpath as make build, make image and the tests' builds have it: vet compiles
	@# every package, and these builds then find them compiled (a cold CI run compiles
	@# them once, not twice).
	go vet -trimpath -tags $(GO_TAGS) ./...
	@# The bench's build without the history row, which nothing else compiles: it only
	@# sets a constant, so compiling it is check enough (vetting it took 35 to 46 s cold).
	go build -trimpath -tags $(GO_TAGS),bench_nohistory ./internal/registry
	go mod tidy -diff
	cd hack/tools/controlplane && go mod tidy -diff
	cd hack/tools/helm && go mod tidy -diff
	cd hack/tools/promtool && go mod tidy -diff
	cd hack/tools/image && go mod tidy -diff && go vet -trimpath .
	cd hack/tools/gosec && go mod tidy -diff && go vet -trimpath .

.PHONY: lint
lint: ## Run the outside checkers (hack/lint.sh): staticcheck, gosec, govulncheck, helm lint, promtool, kube-score.
	hack/lint.sh

.PHONY: controlplane
controlplane: ## Build etcd, kube-apiserver and kube-controller-manager into bin/k8s (minutes the first time, then cached).
	hack/build-controlplane.sh

# The release's version, one for the binary, the image and the chart (VERSION;
# CHANGELOG.md says what each brings). The binary names its commit too.
VERSION ?= $(shell cat VERSION)

.PHONY: node
node: controlplane packages ## Build kube-scheduler, kubelet and kube-proxy into bin/k8s too (minutes the first time), and install the node's Debian packages when missing.
	hack/build-controlplane.sh node

.PHONY: packages
packages: ## Install the Debian packages the tests and the node run (PostgreSQL, sqlite3, containerd, runc, CNI plugins, nftables) when missing; root only.
	hack/install-packages.sh

.PHONY: build
build: ## Build the controller (bin/student-controller) and the local launcher (bin/student-dev).
	@# One build of both, with make image's flags and tags (and the control plane's:
	@# hack/build-controlplane.sh): they share every package compiled before (a cold build
	@# of them is minutes; bench/results/history.md).
	go build -trimpath -tags $(GO_TAGS) -ldflags "-X main.version=$(VERSION)" -o bin/ ./cmd/student-controller ./cmd/student-dev

IMAGE_DIR ?= bin/image
IMAGE_PUSH ?=
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)

.PHONY: image
image: ## Build the controller's image as an OCI layout in bin/image/oci, no Docker engine needed; prints its digest. IMAGE_PUSH=REGISTRY/REPO:TAG pushes it too.
	@mkdir -p $(IMAGE_DIR)
	@# Reproducible: no paths, build ID or VCS stamp in the binary; hack/tools/image fixes every timestamp.
	@CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -buildvcs=false -trimpath -tags $(GO_TAGS) -ldflags "-s -w -buildid= -X main.version=$(VERSION)" \
		-o $(abspath $(IMAGE_DIR))/student-controller ./cmd/student-controller
	@cd hack/tools/image && go run -trimpath . -binary $(abspath $(IMAGE_DIR))/student-controller -out $(abspath $(IMAGE_DIR))/oci \
		-version $(VERSION) -revision "$(REVISION)" $(if $(IMAGE_PUSH),-push $(IMAGE_PUSH))

DIST ?= dist
# The CLI's platforms; the image takes the two linux ones.
RELEASE_PLATFORMS := linux/amd64 linux/arm64 darwin/amd64 darwin/arm64
RELEASE_BUILD = $(abspath $(DIST))/build
# REGISTRY=host/path: where a release is published. make release names the image
# there in the packaged chart; make publish pushes there.
REGISTRY ?=
# The two targets check what they are given (hack/release-check.sh) from the
# environment, before a recipe's text holds any of it. A value given on the command
# line or in the environment is refused here if it holds a $, which make itself would
# expand (a $(shell ...) would run) before any recipe line.
$(foreach v,REGISTRY VERSION DIST REVISION,$(if $(filter command environment,$(origin $v)),$(if $(findstring $$,$(value $v)),$(error $v holds a $$, which make would expand: give it without one))))
release publish: override export RELEASE_REGISTRY = $(REGISTRY)
release publish: override export RELEASE_VERSION = $(VERSION)
release publish: override export RELEASE_DIST = $(DIST)
release publish: override export RELEASE_REVISION = $(REVISION)

.PHONY: release
release: ## Write what a release of VERSION to REGISTRY=host/path publishes into dist/, from a clean tree: the student-controller CLI for linux and darwin (amd64, arm64), the image for linux/amd64 and linux/arm64 as one OCI index (a layout tarball; two runs give one digest), the packaged chart (REGISTRY's image of this version by its digest, IfNotPresent), an SBOM of each binary (CycloneDX) and SHA256SUMS.
	@hack/release-check.sh release
	@hack/install-tools.sh helm cyclonedx-gomod
	@rm -rf $(DIST) && mkdir -p $(RELEASE_BUILD)
	@# The binaries name this version and commit (student-controller --version).
	@for platform in $(RELEASE_PLATFORMS); do \
		CGO_ENABLED=0 GOOS=$${platform%/*} GOARCH=$${platform#*/} go build -buildvcs=false -trimpath -tags $(GO_TAGS) \
			-ldflags "-s -w -buildid= -X main.version=$(VERSION) -X main.commit=$(REVISION)" \
			-o $(DIST)/student-controller-$(VERSION)-$${platform%/*}-$${platform#*/} ./cmd/student-controller || exit 1; \
	done
	@cd hack/tools/image && go run -trimpath . -out $(RELEASE_BUILD)/oci -version $(VERSION) -revision "$(REVISION)" \
		-binaries amd64=$(abspath $(DIST))/student-controller-$(VERSION)-linux-amd64,arm64=$(abspath $(DIST))/student-controller-$(VERSION)-linux-arm64 >$(RELEASE_BUILD)/digest
	@# Byte for byte the same on any builder: names sorted, times, owners and modes fixed.
	@tar --format=gnu --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --mode=go-w,a+rX \
		-C $(RELEASE_BUILD)/oci -cf $(DIST)/student-controller-$(VERSION).oci.tar .
	@# The packaged chart runs this version's image from REGISTRY by its digest (the
	@# tag beside it in values.yaml, for people to read), pulled once.
	@cp -r charts/student-controller $(RELEASE_BUILD)/student-controller
	@sed -i -e 's/^  pullPolicy: Always$$/  pullPolicy: IfNotPresent/' \
		-e 's/^  # Always: a restarted Pod checks its pull secret and tag with the registry.$$/  # IfNotPresent: a release names one image, pulled once./' \
		-e 's|^  repository: student-controller$$|  repository: $(REGISTRY)/student-controller|' \
		-e 's|^  tag: ""$$|  tag: "$(VERSION)"|' \
		-e "s|^  digest: \"\"$$|  digest: $$(cat $(RELEASE_BUILD)/digest)|" \
		$(RELEASE_BUILD)/student-controller/values.yaml
	@grep -q '^  pullPolicy: IfNotPresent$$' $(RELEASE_BUILD)/student-controller/values.yaml
	@grep -qxF -- '  repository: $(REGISTRY)/student-controller' $(RELEASE_BUILD)/student-controller/values.yaml
	@grep -qxF -- "  digest: $$(cat $(RELEASE_BUILD)/digest)" $(RELEASE_BUILD)/student-controller/values.yaml
	@bin/tools/helm package $(RELEASE_BUILD)/student-controller --version $(VERSION) --app-version $(VERSION) -d $(DIST) >/dev/null
	@# One SBOM per binary, of the modules its build links (its platform and tags).
	@for platform in $(RELEASE_PLATFORMS); do \
		GOOS=$${platform%/*} GOARCH=$${platform#*/} GOFLAGS=-tags=$(GO_TAGS) bin/tools/cyclonedx-gomod app -json -noserial \
			-output $(DIST)/student-controller-$(VERSION)-$${platform%/*}-$${platform#*/}.sbom.cdx.json -main cmd/student-controller . || exit 1; \
	done
	@echo "image index $$(cat $(RELEASE_BUILD)/digest) (linux/amd64, linux/arm64)"
	@rm -rf $(RELEASE_BUILD)
	@cd $(DIST) && sha256sum * >SHA256SUMS && cat SHA256SUMS

# PUBLISH_HELM_FLAGS, e.g. --plain-http for a registry on loopback.
PUBLISH_HELM_FLAGS ?=

.PHONY: publish
publish: ## Push what make release wrote to an OCI registry: the image index as REGISTRY/student-controller:VERSION and the chart as oci://REGISTRY/charts/student-controller; never over a published version. REGISTRY=host/path.
	@hack/release-check.sh publish
	@hack/install-tools.sh helm
	@# Only a finished release, as its sums say: never an image without its chart.
	@test -f $(DIST)/SHA256SUMS -a -f $(DIST)/student-controller-$(VERSION).tgz || { echo "make publish: no finished release of $(VERSION) in $(DIST); run make release first" >&2; exit 2; }
	@cd $(DIST) && sha256sum --check --quiet SHA256SUMS
	@tar -xOf $(DIST)/student-controller-$(VERSION).tgz student-controller/values.yaml | grep -qxF -- '  repository: $(REGISTRY)/student-controller' || \
		{ echo "make publish: the release in $(DIST) names its image elsewhere ($$(tar -xOf $(DIST)/student-controller-$(VERSION).tgz student-controller/values.yaml | grep -m1 '^  repository:')); run make release REGISTRY=$(REGISTRY)" >&2; exit 2; }
	@rm -rf $(RELEASE_BUILD) && mkdir -p $(RELEASE_BUILD)/oci && tar -xf $(DIST)/student-controller-$(VERSION).oci.tar -C $(RELEASE_BUILD)/oci
	@# A published version is never replaced: the image tag may hold only this index (a
	@# publish cut short runs again), and the chart's version must not be there yet.
	@cd hack/tools/image && go run -trimpath . -layout $(RELEASE_BUILD)/oci -push $(REGISTRY)/student-controller:$(VERSION) \
		-unpublished $(REGISTRY)/charts/student-controller:$(VERSION)
	@bin/tools/helm push $(DIST)/student-controller-$(VERSION).tgz oci://$(REGISTRY)/charts $(PUBLISH_HELM_FLAGS)
	@rm -rf $(RELEASE_BUILD)

STATE_DIR ?= .local
RUN_FLAGS ?=

.PHONY: run
run: build ## Run everything locally: control plane, CRD, samples, controller on SQLite. Ctrl-C stops it.
	@# etcd and kube-apiserver first; student-dev builds kube-controller-manager (if it is
	@# not built yet) while the rest starts, and starts it once built.
	hack/build-controlplane.sh etcd kube-apiserver
	bin/student-dev --state-dir $(STATE_DIR) $(RUN_FLAGS)

.PHONY: cluster
cluster: node image helm build ## Run a one-node cluster (the control plane, kubelet over containerd, kube-proxy) with the chart installed from make image's image, as root; Ctrl-C stops it and removes what the node made.
	@# The node's launcher is apart from make run's, which never compiles the node's code.
	go build -trimpath -tags $(GO_TAGS) -o bin/ ./cmd/student-node
	bin/student-node cluster --state-dir $(STATE_DIR)/cluster

.PHONY: helm
helm: ## Build the Helm CLI that hack/tools/helm pins into bin/tools (the chart tests and make lint use it).
	hack/install-tools.sh helm

.PHONY: test
# Two go tests at once, neither with go test's vet (make verify and make check vet the
# same code with every analyzer; each go test would compute its facts again). With the
# race detector: the registry, whose unit tests drive the process's own concurrency over
# the database (group commit, turns, the fence's renewal); its race build is small (72 s
# of CPU cold), where the controller's packages would compile client-go's tree again
# with -race (437 s: bench/results/history.md). make race runs those.
# Without it (-p 3: three packages built or run at a time), long suites first: the
# suites that drive programs (the chaos suite among them), then the rest, built as go
# vet built them (static, -trimpath, the shipped tags), so they link and start at once.
# The command's own goroutines (leader election, the lease gate, the servers) run under
# the race detector in make chaos, whose controllers are built with it.
# Test binaries are linked without DWARF (-w), which only a debugger reads (the e2e
# suite's link, warm: 10.1 s of CPU against 7.0 s; bench/results/history.md). An
# -ldflags in GO_TEST_FLAGS replaces it; one in GOFLAGS is overridden.
TEST_LDFLAGS := -ldflags=-w
LONG_SUITES := ./test/e2e ./test/chaos ./test/node ./test/local ./test/integration ./test/codegen
RACE_PACKAGES := ./internal/registry
RACE_TEST := CGO_ENABLED=1 go test -race -vet=off -tags $(GO_TAGS) $(TEST_LDFLAGS) -timeout 30m $(GO_TEST_FLAGS)

test: node helm ## Run every test: unit, integration against the real control plane, the node suite (root), codegen checks.
	@# The race detector needs cgo on Linux. A suite that timed out or panicked never ran
	@# its own clean-up: put back what the node suite's node left (clean-node reads the
	@# record the node keeps).
	long="$$(go list $(LONG_SUITES))"; race="$$(go list $(RACE_PACKAGES))"; \
	others="$$(go list ./... | grep -v -x -F -e "$$long" -e "$$race")"; \
	go test -p 3 -vet=off -trimpath -tags $(GO_TAGS) $(TEST_LDFLAGS) -timeout 30m $(GO_TEST_FLAGS) $$long $$others & suites=$$!; \
	unitrc=0; $(RACE_TEST) $$race || unitrc=$$?; \
	rest=0; wait $$suites || rest=$$?; \
	if (( unitrc || rest )); then \
		echo "make test: failed (with the race detector: exit $$unitrc; without it: exit $$rest)"; \
		go run -trimpath ./cmd/student-node clean-node || true; exit 1; \
	fi
	cd hack/tools/image && go test -trimpath $(GO_TEST_FLAGS) ./...

.PHONY: race
race: packages ## The unit tests of the controller's packages (internal/ but its test helpers, pkg/) with the race detector; minutes cold, as it compiles client-go again with -race. No node.
	$(RACE_TEST) $$(go list ./internal/... ./pkg/... | grep -v /internal/testenv)

.PHONY: check
check: ## The inner loop, in minutes: go vet and the unit tests of cmd/, internal/ and pkg/ (-short). No root, no node, no control plane; test/ is make test's.
	go vet -trimpath -tags $(GO_TAGS) ./...
	go test -short -trimpath -tags $(GO_TAGS) ./cmd/... ./internal/... ./pkg/...

CHAOS_N ?= 2000

.PHONY: chaos
chaos: controlplane ## Strike the fault schedule on both registries with CHAOS_N Students (default 2000), its controllers built with the race detector; results in chaos/results.
	CHAOS_N=$(CHAOS_N) CHAOS_RESULTS=$(CURDIR)/chaos/results go test -tags chaosrace -count=1 -timeout 0 -run '^TestChaos$$' -v ./test/chaos

FUZZ ?= FuzzParseURL
FUZZTIME ?= 10m

.PHONY: fuzz
fuzz: controlplane ## Run one fuzz target (FUZZ, default FuzzParseURL) for FUZZTIME (default 10m); findings land in its testdata/fuzz.
	@pkg="$$(grep -rl --include='*_test.go' 'func $(FUZZ)(' . | xargs -r -n1 dirname | sort -u)"; \
	if [[ -z "$$pkg" ]]; then echo "no fuzz target $(FUZZ)"; exit 2; fi; \
	go test -run '^$$' -fuzz '^$(FUZZ)$$' -fuzztime $(FUZZTIME) -timeout 0 "$$pkg"

# Where make bench and make bench-registry write their results: bench/out (ignored by
# git) unless RESULTS=bench/results publishes them over the committed set.
RESULTS ?= bench/out

.PHONY: bench-registry
bench-registry: ## Time a registry row write (SQLite NORMAL and FULL, fenced or not; PostgreSQL), and 8 at once on SQLite (group commit, the busy handler alone, group commit over 100000 rows), into $(RESULTS)/registry-writes.txt; then a new Student's row (Get then upsert, against Insert), the two alternating, into $(RESULTS)/new-student-row.txt.
	@# Each file starts with the build it measured, in benchstat's "key: value" form.
	mkdir -p $(RESULTS)
	{ $(BENCH_BUILD); go test -run '^$$' -bench '^BenchmarkWrite(Concurrent)?$$' -benchtime 2000x -count 5 ./internal/registry; } | tee $(RESULTS)/registry-writes.txt
	{ $(BENCH_BUILD); for i in 1 2 3 4 5 6; do go test -run '^$$' -bench '^BenchmarkNewStudentRow$$' -benchtime 2000x ./internal/registry || exit 1; done; } | tee $(RESULTS)/new-student-row.txt
BENCH_BUILD = echo "build: $$(git rev-parse --short HEAD)$$(git diff --quiet HEAD -- . ':!bench/results' || echo -dirty)"; \
	echo "version: $(VERSION)"; echo "date: $$(date -u +%Y-%m-%dT%H:%M:%SZ)"

BENCH_N ?= 10000

.PHONY: bench
bench: controlplane ## Benchmark against the alternatives; results in bench/out, or RESULTS=bench/results to publish them (BENCH_N=500 for a quick run).
	@# Built, then run: `go run` does not pass SIGTERM on, and the bench must get it to stop
	@# its contender and control plane.
	go build -trimpath -o bin/bench ./test/bench
	bin/bench -n $(BENCH_N) -out $(RESULTS)
