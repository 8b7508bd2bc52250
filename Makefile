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

.PHONY: help
help: ## List targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-14s %s\n", $$1, $$2}'

.PHONY: demo
# The demo builds the envtest binaries itself on first use (with progress
# lines), writes .demo/{hub,spoke}.kubeconfig and runs until Ctrl-C.
demo: ## Run the product on an embedded hub + spoke with simulated AWS (Ctrl-C stops it all)
	@echo "demo: compiling cmd/demo (the first build compiles about 1,250 packages: about 6 minutes on 2 cores)"
	@# -v names each package compiled; count them instead of staying silent.
	@go build -v -o $(BIN_DIR)/demo ./cmd/demo 2>&1 | \
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
test: ## Run every test against real API servers
	KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" go test -count=1 -timeout $(TEST_TIMEOUT) ./...

.PHONY: model
model: ## Randomized model of MachineDeployment binding (MODEL_STEPS, MODEL_SEED)
	MODEL_STEPS=$${MODEL_STEPS:-20000} go test -count=1 -timeout 0 -run TestBindingModel -v ./pkg/machinedeployment/model

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
	@# The Helm chart carries the same CRDs and RBAC rules.
	rm -f charts/karpenter-clusterapi/crds/*.yaml && cp config/crd/bases/*.yaml config/crd/karpenter/*.yaml charts/karpenter-clusterapi/crds/
	cp config/rbac/hub/role.yaml charts/karpenter-clusterapi/rbac/hub-role.yaml
	cp config/rbac/workload/role.yaml charts/karpenter-clusterapi/rbac/workload-role.yaml
	cp config/rbac/workload/core_role.yaml charts/karpenter-clusterapi/rbac/core-role.yaml

.PHONY: verify
verify: generate ## Fail when generated files or go.mod are stale
	go mod tidy
	@git diff --exit-code -- go.mod go.sum pkg/apis pkg/operator/crds/bases config charts/karpenter-clusterapi/crds charts/karpenter-clusterapi/rbac || \
		{ echo "generated files are stale: run 'make generate' (and 'go mod tidy') and commit the result"; exit 1; }
	@untracked=$$(git ls-files --others --exclude-standard -- pkg/apis pkg/operator/crds/bases config charts/karpenter-clusterapi/crds charts/karpenter-clusterapi/rbac); \
		if [ -n "$$untracked" ]; then echo "generated files not committed: $$untracked"; exit 1; fi

.PHONY: lint
lint: ## go vet and gofmt
	go vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

.PHONY: image
image: ## Build the container image (needs a Docker engine)
	docker build -t $(IMG) .
