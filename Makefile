# karpenter-clusterapi: Karpenter with Cluster API as its cloud.
SHELL := /usr/bin/env bash -o pipefail
# go.mod asks for Go 1.26.9; machines with an older local Go fetch it once.
export GOTOOLCHAIN ?= auto

BIN_DIR ?= bin
IMG ?= ghcr.io/autonode/karpenter-clusterapi:dev
TOOLS := go tool -modfile=hack/tools/go.mod
# Real API servers for tests, built once and cached outside the repository.
ENVTEST_ASSETS = $(shell hack/envtest-bins.sh)
TEST_TIMEOUT ?= 60m
# CAPA's controller manager for test/e2ecapa, built once from CAPA's own
# module at the version in go.mod and cached outside the repository.
CAPA_BIN = $(shell hack/capa-bin.sh)

.PHONY: help
help: ## List targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-14s %s\n", $$1, $$2}'

.PHONY: demo
# The demo builds the envtest binaries itself on first use (with progress
# lines), writes .demo/{hub,spoke}.kubeconfig and runs until Ctrl-C.
demo: ## Run the product on an embedded hub + spoke with simulated AWS (Ctrl-C stops it all)
	@echo "demo: compiling cmd/demo (the first build compiles about 1,250 packages: about 6 minutes on 2 cores)"
	@# -v names each package compiled; count them instead of staying silent.
	@# CGO_ENABLED=0 as the provider binary the demo builds: its packages are then compiled once.
	@CGO_ENABLED=0 go build -v -o $(BIN_DIR)/demo ./cmd/demo 2>&1 | \
	  awk '/[ :]/ { print; fflush(); next } { n++ } n % 50 == 0 { print "demo: compiled " n " packages"; fflush() }'
	@exec $(BIN_DIR)/demo $(DEMO_ARGS)

.PHONY: build
build: ## Build the controller binary
	CGO_ENABLED=0 go build -trimpath -o $(BIN_DIR)/karpenter-clusterapi .

.PHONY: run
run: ## Run the controller against KUBECONFIG (and CLUSTER_API_KUBECONFIG)
	go run . $(ARGS)

.PHONY: envtest
envtest: ## Build (first run) and print the cached test API server binaries
	@echo "KUBEBUILDER_ASSETS=$(ENVTEST_ASSETS)"

.PHONY: test
# -count=1: test/e2e runs the provider binary it builds, which the test cache cannot see.
# hack/test.sh runs test/e2e as E2E_SHARDS processes (default 2, each with a
# world of its own) beside `go test` of every other package.
test: ## Run every test against real API servers (test/e2ecapa: the CI subset)
	KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" CAPA_BIN="$(CAPA_BIN)" TEST_TIMEOUT=$(TEST_TIMEOUT) hack/test.sh

.PHONY: test-upgrade
# Not part of `make test`: it builds the provider of the commit before issue
# 35's MachineDeployment rework (hack/provider-at.sh, cached outside the
# repository by commit; about 4 minutes on 2 cores the first time).
test-upgrade: ## Upgrade in place from the MachineDeployment design before issue 35 (old binary killed mid-burst, new one converges)
	KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" E2E_UPGRADE=1 go test -count=1 -timeout 30m -v -run TestUpgradeInPlaceFromTheOldMachineDeploymentDesign ./test/e2e

.PHONY: test-capa
test-capa: ## Every scenario with CAPA's real controllers against a simulated EC2 (test/e2ecapa)
	KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" CAPA_BIN="$(CAPA_BIN)" E2E_CAPA_ALL=1 go test -count=1 -timeout $(TEST_TIMEOUT) -v ./test/e2ecapa

.PHONY: model
model: ## Randomized model of MachineDeployment binding (MODEL_STEPS, MODEL_SEED)
	MODEL_STEPS=$${MODEL_STEPS:-20000} go test -count=1 -timeout 0 -run TestBindingModel -v ./pkg/machinedeployment/model

.PHONY: soak
# Not part of `make test`: two replicas, both modes, a seeded random schedule
# of faults (replicas killed, API servers down, capacity exhausted, Machines
# deleted, drift) and invariants checked throughout. SOAK_SEED replays a
# schedule; the seed is printed at the start and in every failure.
SOAK_DURATION ?= 30m
SOAK_SEED ?= 0
soak: ## 30-minute chaos soak with two replicas (SOAK_DURATION, SOAK_SEED)
	KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" go test -tags soak -count=1 -timeout 90m -v ./test/soak -run TestSoak \
		-args -soak.duration=$(SOAK_DURATION) -soak.seed=$(SOAK_SEED)

.PHONY: soak-short
soak-short: ## The soak for 10 minutes (nightly-style CI target)
	$(MAKE) soak SOAK_DURATION=10m

.PHONY: conformance
# Karpenter's own e2e suites (regression, disruption) against the provider in
# both modes, one fresh world per group of specs; CONFORMANCE_ARGS narrows it
# (e.g. -modes machine -groups 'Termination|Drift'). Report in .conformance/.
conformance: ## Run Karpenter's upstream e2e suites in both modes (hours on 2 cores; see docs/conformance.md)
	suites="$$(hack/conformance-bins.sh)" && KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" CONFORMANCE_SUITES="$$suites" \
		go run ./cmd/conformance $(CONFORMANCE_ARGS)

.PHONY: bench
bench: ## All benchmarks as one table + bench-results.json (exit 1 when a target is missed)
	KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" hack/bench.sh

.PHONY: bench-1000
bench-1000: ## Burst to 1,000 single-pod nodes and back to 0 per contender, with CPU profiles (heavy: a quiet machine)
	KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" hack/bench-1000.sh

.PHONY: generate
generate: ## Generate deepcopy, CRDs and RBAC
	$(TOOLS) controller-gen object paths=./pkg/apis/...
	$(TOOLS) controller-gen crd paths=./pkg/apis/... output:crd:artifacts:config=config/crd/bases
	@# go:embed cannot reach config/: --install-workload-crds embeds a copy.
	rm -f pkg/operator/crds/bases/*.yaml && cp config/crd/bases/*.yaml pkg/operator/crds/bases/
	@# Karpenter core's CRDs ship with the provider: copies from the sigs.k8s.io/karpenter module in go.mod.
	karpenter=$$(go list -m -f '{{.Dir}}' sigs.k8s.io/karpenter) && for crd in nodepools nodeclaims nodeoverlays; do \
		install -m 0644 "$$karpenter/pkg/apis/crds/karpenter.sh_$$crd.yaml" config/crd/karpenter/; done
	$(TOOLS) controller-gen rbac:roleName=karpenter-clusterapi-hub paths=./pkg/hub/... output:rbac:artifacts:config=config/rbac/hub
	$(TOOLS) controller-gen rbac:roleName=karpenter-clusterapi-workload paths=./pkg/controllers/... output:rbac:artifacts:config=config/rbac/workload
	@# Granted only with --approve-kubelet-csrs (config/components/approve-kubelet-csrs, Helm value approveKubeletCSRs).
	$(TOOLS) controller-gen rbac:roleName=karpenter-clusterapi-csr-approver paths=./pkg/csrapproval output:rbac:artifacts:config=config/rbac/csr-approver
	@# Granted only with --kubelet-csr-bootstrap-authorization=subjectaccessreview (config/components/kubelet-csr-subjectaccessreview).
	$(TOOLS) controller-gen rbac:roleName=karpenter-clusterapi-csr-approver-sar paths=./pkg/csrapproval/subjectaccessreview output:rbac:artifacts:config=config/rbac/csr-approver-sar
	@# The AutoNode controller (karpenter-clusterapi autonode), in the management cluster.
	$(TOOLS) controller-gen rbac:roleName=karpenter-clusterapi-autonode paths=./pkg/autonode/... output:rbac:artifacts:config=config/rbac/autonode
	@# The Helm chart carries the same CRDs and RBAC rules.
	rm -f charts/karpenter-clusterapi/crds/*.yaml && cp config/crd/bases/*.yaml config/crd/karpenter/*.yaml charts/karpenter-clusterapi/crds/
	cp config/rbac/hub/role.yaml charts/karpenter-clusterapi/rbac/hub-role.yaml
	cp config/rbac/workload/role.yaml charts/karpenter-clusterapi/rbac/workload-role.yaml
	cp config/rbac/workload/core_role.yaml charts/karpenter-clusterapi/rbac/core-role.yaml
	cp config/rbac/csr-approver/role.yaml charts/karpenter-clusterapi/rbac/csr-approver-role.yaml
	cp config/rbac/autonode/role.yaml charts/karpenter-clusterapi-autonode/rbac/autonode-role.yaml
	cp config/rbac/hub/role.yaml charts/karpenter-clusterapi-autonode/rbac/hub-role.yaml
	cp config/rbac/csr-approver-sar/role.yaml charts/karpenter-clusterapi/rbac/csr-approver-sar-role.yaml
	@# AutoNode applies the provider's workload-cluster RBAC itself (go:embed cannot reach config/).
	rm -f pkg/autonode/workloadrbac/*.yaml
	for f in role core_role role_binding leader_election_role node_lease_role; do cp config/rbac/workload/$$f.yaml pkg/autonode/workloadrbac/workload-$$f.yaml; done
	for f in role role_binding; do cp config/rbac/csr-approver/$$f.yaml pkg/autonode/workloadrbac/csr-approver-$$f.yaml; done

.PHONY: verify
verify: generate ## Fail when generated files or go.mod are stale
	go mod tidy
	@git diff --exit-code -- go.mod go.sum pkg/apis pkg/operator/crds/bases pkg/autonode/workloadrbac config charts/karpenter-clusterapi/crds charts/karpenter-clusterapi/rbac charts/karpenter-clusterapi-autonode/rbac || \
		{ echo "generated files are stale: run 'make generate' (and 'go mod tidy') and commit the result"; exit 1; }
	@untracked=$$(git ls-files --others --exclude-standard -- pkg/apis pkg/operator/crds/bases pkg/autonode/workloadrbac config charts/karpenter-clusterapi/crds charts/karpenter-clusterapi/rbac charts/karpenter-clusterapi-autonode/rbac); \
		if [ -n "$$untracked" ]; then echo "generated files not committed: $$untracked"; exit 1; fi

.PHONY: lint
lint: ## go vet and gofmt
	go vet ./...
	go vet -tags soak ./test/soak
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

.PHONY: image
image: ## Build the container image (needs a Docker engine)
	docker build -t $(IMG) .
