# gpu-dra-driver — everyday entry points. `make help` lists them.
SHELL := /bin/bash
export CGO_ENABLED := 1
# go-nvml's generated cgo wrappers call deprecated NVML functions; the
# warnings say nothing about this project.
export CGO_CFLAGS := -O2 -g -Wno-deprecated-declarations
GO ?= go
BIN := bin
FUZZTIME ?= 30s
IMAGE_REF ?= gdd.local/gpu-dra-driver:dev
IMAGE_TAR ?= $(BIN)/gpu-dra-driver-image.tar

.PHONY: help build test check unit campaign crash fuzz vet bench print-slices clean image demo e2e gpu-check-sim

help: ## Show targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

build: ## Build the binaries into bin/
	$(GO) build -o $(BIN)/ ./cmd/...

vet: ## go vet, gofmt finds nothing to change, shellcheck passes the shell scripts
	$(GO) vet ./...
	@unformatted=$$(gofmt -l $$(git ls-files -co --exclude-standard '*.go')); \
	if [[ -n $$unformatted ]]; then echo "gofmt -w these files: $$unformatted" >&2; exit 1; fi
	@command -v shellcheck >/dev/null || { echo "vet needs shellcheck: apt-get install shellcheck (Debian package)" >&2; exit 1; }
	shellcheck -x $$(git ls-files -co --exclude-standard '*.sh' .ci/run)

# The chart's admission-policy tests render it with the helm hack/cluster builds, when built.
CLUSTER_HELM := $(shell hack/cluster/build.sh --print-bin-dir 2>/dev/null)/helm
unit: ## Unit, node (kubelet stand-in) and crash tests
	HELM=$${HELM:-$$([[ -x $(CLUSTER_HELM) ]] && echo $(CLUSTER_HELM))} $(GO) test -count=1 ./...

campaign: ## Long fault campaign against the plugin process: make campaign [SEED=N] [OPS=500] [OPEN_BUGS=all|none|a,b]
	$(GO) test -count=1 -timeout=60m -v -run='^TestCampaign$$' ./test/campaign \
		-args -ops=$(or $(OPS),500) -seed=$(or $(SEED),0) -open-bugs=$(or $(OPEN_BUGS),all)

crash: ## SIGKILL the plugin mid-prepare/unprepare and check recovery; SEED=N replays a run's random kills: make crash [SEED=N]
	$(GO) test -count=1 -v -run='^TestCrashConvergence$$' ./test/crash -args -seed=$(or $(SEED),0)

fuzz: ## Fuzz the parameter API decoder, own and NVIDIA's configs, for $(FUZZTIME) each (corpus checked in)
	$(GO) test -run='^$$' -fuzz=FuzzDecodeDefaultValidate -fuzztime=$(FUZZTIME) ./api/gpu/v1beta1
	$(GO) test -run='^$$' -fuzz=FuzzDecodeDefaultValidate -fuzztime=$(FUZZTIME) ./pkg/opaqueconfig

gpu-check-sim: ## Build the carried gpu-check bundle (.gpu-check/) and dry-run it on a simulated H200 as the device machine would
	./hack/gpu-check.sh build
	./hack/gpu-check.sh sim

check: vet unit fuzz gpu-check-sim ## Everything that needs no cluster: vet, unit/node/crash tests, fuzzing (minutes)
	cd hack/tools && $(GO) test -count=1 ./cmd/mkimage/...

test: check e2e ## Everything CI runs (.ci/run): check, then the e2e suite on a local cluster

bench: build ## Go benchmarks, no cluster, printed as a table (figures go to docs/performance.md; on a cluster: hack/demo/bench-cluster.sh)
	./hack/bench-go.sh

print-slices: build ## Print the ResourceSlices of a simulated machine: make print-slices MACHINE=dgxh100
	./$(BIN)/dra-kubelet-plugin --simulate=$(or $(MACHINE),dgxh100) --node-name=$(or $(NODE),node-1) --print-slices

image: ## Driver image tar without a registry ($(IMAGE_REF) -> $(IMAGE_TAR)); import with hack/cluster/up.sh --image
	IMAGE_REF=$(IMAGE_REF) ./hack/demo/image.sh $(IMAGE_TAR)

demo: ## Local cluster + chart with simulated GPUs + every demo/specs scenario, then teardown (KEEP=1 keeps it)
	./hack/demo/demo.sh $(DEMO_ARGS)

e2e: ## Local cluster + chart with simulated GPUs + test/e2e, then teardown (~6 min warm; KEEP=1 keeps it)
	./hack/demo/e2e.sh $(E2E_ARGS)

clean:
	rm -rf $(BIN)
