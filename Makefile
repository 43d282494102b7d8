# HareBox. `make demo` runs the untrusted-code walkthrough on a real VM;
# `make test` runs every test. Both install what they need first.
SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(PATH)
export CGO_ENABLED ?= 0
GO ?= go
BIN := bin
CACHE := $(CURDIR)/.cache
# The test suite's guest images: built once per machine and kept in the
# user's cache, as Go keeps its build cache, for every clone to share
# (each build is keyed by its inputs); make test first removes the builds
# that newer ones replaced (harebox-image gc). The tests read it from
# HAREBOX_TEST_IMAGES, with the same default (internal/testimage).
TEST_IMAGES ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/harebox/test-images
export HAREBOX_TEST_IMAGES := $(TEST_IMAGES)
GOFLAGS_BUILD := -trimpath -buildvcs=false
VERSION := $(shell git describe --always --dirty 2>/dev/null || echo dev)

.PHONY: all deps console build install image image-default image-code-interpreter prebuild-default-image demo test test-short fuzz bench reliability proto vet lint-openapi clean

all: build

deps:
	@./scripts/deps.sh

# The web console's assets (console/web -> console/dist, embedded in
# hareboxd): built with esbuild from the lock file. dist/ is committed, so
# a plain go build needs no npm; a test fails when it is stale.
console:
	@test -f console/web/node_modules/.package-lock.json || (cd console/web && npm ci --no-audit --no-fund --loglevel=error)
	@cd console/web && npm run --silent build

build: console
	$(GO) build $(GOFLAGS_BUILD) -ldflags='-s -w' -o $(BIN)/harebox-agent ./cmd/harebox-agent
	$(GO) build $(GOFLAGS_BUILD) -o $(BIN)/harebox-plugin-qemu ./cmd/harebox-plugin-qemu
	$(GO) build $(GOFLAGS_BUILD) -o $(BIN)/harebox-plugin-cloud-hypervisor ./cmd/harebox-plugin-cloud-hypervisor
	$(GO) build $(GOFLAGS_BUILD) -o $(BIN)/harebox-image ./cmd/harebox-image
	$(GO) build $(GOFLAGS_BUILD) -o $(BIN)/harebox-demo ./examples/bootvm
	$(GO) build $(GOFLAGS_BUILD) -ldflags="-X main.version=$(VERSION)" -o $(BIN)/hareboxd ./cmd/hareboxd
	$(GO) build $(GOFLAGS_BUILD) -ldflags="-X main.version=$(VERSION)" -o $(BIN)/harebox ./cmd/harebox

# Binaries, the guest agent, the systemd unit and a first config file
# (PREFIX=/usr/local, DESTDIR= for a staging root); see docs/deploy.md.
install: build
	@./scripts/install.sh

# Guest images, cached under .cache/images and rebuilt only when an input changes.
image: deps build
	$(BIN)/harebox-image build --name minimal --agent $(BIN)/harebox-agent --out $(CACHE)/images

image-default: deps build
	$(BIN)/harebox-image build --name default --agent $(BIN)/harebox-agent --out $(CACHE)/images

image-code-interpreter: deps build
	$(BIN)/harebox-image build --name code-interpreter --agent $(BIN)/harebox-agent --out $(CACHE)/images

# The untrusted-code walkthrough: hareboxd on a temporary data directory,
# the CLI walkthrough against it with a transcript, then clean up.
demo: deps build
	@./scripts/demo.sh

# The same story one level down: the QEMU plugin, one VM, a fork.
demo-vm: deps build
	@$(BIN)/harebox-image build --name minimal --agent $(BIN)/harebox-agent --out $(CACHE)/images > $(CACHE)/minimal.json
	$(BIN)/harebox-demo --image $(CACHE)/minimal.json --plugin $(BIN)/harebox-plugin-qemu

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l . | tee /dev/stderr)" || { echo "gofmt: files above need formatting"; exit 1; }

# The OpenAPI document against Redocly's recommended rules: no error and
# no warning (api/.redocly.lint-ignore.yaml says which three it waives and
# why). No telemetry, no update check.
REDOCLY := REDOCLY_TELEMETRY=off REDOCLY_SUPPRESS_UPDATE_NOTICE=true ../scripts/openapi-lint/node_modules/.bin/redocly
lint-openapi: deps
	@cd api && $(REDOCLY) lint openapi.yaml --format=json 2>/dev/null | jq -e '.totals.errors == 0 and .totals.warnings == 0' >/dev/null || \
		{ $(REDOCLY) lint openapi.yaml; echo "lint-openapi: api/openapi.yaml has errors or warnings (above)"; exit 1; }
	@echo "lint-openapi: api/openapi.yaml passes Redocly's recommended rules"

# The Debian images take a minute or two each to build on a fresh machine
# (debootstrap): they build in the background, one after the other, while
# vet, the lint, the compiles and the tests that need neither run, each
# under its image's lock (internal/testimage) and with the agent built as
# the tests build it, so the tests find them cached. A test that needs one
# waits on its lock, and builds it itself if this build failed (its log:
# .cache/image-NAME.log).
prebuild-default-image: deps
	@mkdir -p $(CACHE)/bin && $(GO) build $(GOFLAGS_BUILD) -ldflags='-s -w' -o $(CACHE)/bin/harebox-agent ./cmd/harebox-agent && \
		cp $(CACHE)/bin/harebox-agent $(CACHE)/prebuild-agent && \
		$(GO) build $(GOFLAGS_BUILD) -o $(BIN)/harebox-image ./cmd/harebox-image
	@# (The test engines' reference files of a run that was killed, left
	@# behind, would keep every build from then on: an engine writes its
	@# file every minute, so one two hours old is a dead engine's.)
	@mkdir -p $(TEST_IMAGES)/.refs && find $(TEST_IMAGES)/.refs -type f -mmin +120 -delete && \
		$(BIN)/harebox-image gc --out $(TEST_IMAGES) --no-engine >$(CACHE)/image-gc.log 2>&1 || \
		{ echo "harebox-image gc failed ($(CACHE)/image-gc.log):"; tail -5 $(CACHE)/image-gc.log; }
	@(for name in default code-interpreter; do flock $(CACHE)/lock-image-$$name $(BIN)/harebox-image build --name $$name \
		--agent $(CACHE)/prebuild-agent --out $(TEST_IMAGES) </dev/null >$(CACHE)/image-$$name.log 2>&1; done &)

test: export HAREBOX_TEST_DEFAULT_IMAGE = 1
# Go's cache keys hold the clone's directory unless -trimpath: with it, a
# fresh clone finds the packages, vet results and test objects that runs
# of the same sources on this machine compiled (a fresh clone's test
# builds: 161 CPU-s without, 64 with). Test binaries carry no DWARF
# (-w: a quarter of a link; tracebacks do not need it).
test: export GOFLAGS += -trimpath -ldflags=-w
test: deps prebuild-default-image vet lint-openapi
	@# The long packages with guests run in the main run, the two longest
	@# first (the engine's and e2e/host's), then the others, longest
	@# first: go test starts packages in the order given, two at a time
	@# on two cores, and this order splits them into two lanes of about
	@# the same length (fresh run 160: 413 + 309 + 161 s, 489 + 246 +
	@# 120 s). On a machine's first run the second waits about two
	@# minutes for the Debian image (built in the background from the
	@# start).
	@# Beside it, one at a time, on the core the guests leave idle now and
	@# then: every other package (seconds each, most of it building), then
	@# the short packages with guests (a minute or so each: last in the
	@# main run, they ended it with the cores a third idle). Beside both,
	@# from the start: the engine's concurrency tests again, twice, under
	@# the race detector (in memory, no VM; before the other packages,
	@# they made that lane the last to end, alone on the cores for a
	@# minute and a half: fresh runs 166 and 167).
	@# testlog prints what go test would (results, failures' output) and
	@# keeps each test's time: the run ends with the 10 slowest tests,
	@# even after a failure (read from the file).
	@mkdir -p $(CACHE) && rm -f $(CACHE)/test-times.tsv && $(GO) build -o $(BIN)/testlog ./internal/cmd/testlog
	@# The test servers share their golden snapshots for this run (in a
	@# directory of its own, removed at its end): each image and size
	@# boots once for them all. A golden machine of a server a test
	@# killed (its VMM outlives it, as a sandbox's does) that no later
	@# server stopped is stopped at the end, and said.
	@set -o pipefail; \
	gold=$$(mktemp -d /tmp/hbgold.XXXXXX) && export HAREBOX_TEST_GOLDEN_DIR=$$gold && \
	trap 'n=$$(pkill -9 -c -f -- "-name harebox-golden-.*$$gold/"); test "$$n" -gt 0 && echo "make test: stopped $$n golden machines of killed servers"; rm -rf "$$gold"' EXIT; \
	guests=$$($(GO) list $(GUEST_PACKAGES) $(SHORT_GUEST_PACKAGES)) && rest=$$($(GO) list ./... | grep -vxF "$$guests") && test -n "$$guests" || \
		{ echo "make test: cannot list the packages"; exit 1; }; \
	( CGO_ENABLED=1 $(GO) test -json -race -count=2 -timeout 10m -run 'TestBudgetConcurrentCreates|TestBudgetNeverOverspends|TestStartDeleteRace|TestSnapshotsAndFork|TestHibernate$$|TestGoldenSnapshots|TestPool$$' . 2>&1 | \
		$(BIN)/testlog -save $(CACHE)/test-times.tsv >$(CACHE)/test-race.log 2>&1 ) & racer=$$!; \
	( $(GO) test -json -p 1 -timeout 10m -count=1 $$rest $(SHORT_GUEST_PACKAGES) 2>&1 | $(BIN)/testlog -save $(CACHE)/test-times.tsv >$(CACHE)/test-rest.log 2>&1 ) & beside=$$!; \
	$(GO) test -json -timeout 24m -count=1 $(GUEST_PACKAGES) 2>&1 | $(BIN)/testlog -save $(CACHE)/test-times.tsv; main=$$?; \
	wait $$beside; besides=$$?; wait $$racer; raced=$$?; echo "the other packages, and under the race detector:"; cat $(CACHE)/test-rest.log $(CACHE)/test-race.log; \
	$(BIN)/testlog -save $(CACHE)/test-times.tsv -slowest 10 </dev/null; \
	test $$main = 0 && test $$besides = 0 && test $$raced = 0

# GUEST_PACKAGES are the long packages whose tests run guests (QEMU),
# in the order that splits them into two lanes of about the same length
# (above): make test runs them two at a time, and beside them the rest,
# then SHORT_GUEST_PACKAGES, the short ones with guests.
GUEST_PACKAGES := . ./e2e/host/ ./e2e/clients/ ./e2e/code/ ./e2e/ ./e2e/docs/
SHORT_GUEST_PACKAGES := ./network/linuxnet/ ./images/ ./api/ ./e2e/console/ ./backends/qemu/ ./hypervisor/vhostblk/

# Each fuzz target for a short while (go test -fuzz takes one target at a time).
fuzz:
	$(GO) test ./agent/client/ -run XXX -fuzz FuzzGuestStream -fuzztime 30s
	$(GO) test ./agent/client/ -run XXX -fuzz FuzzGuestMessages -fuzztime 30s
	$(GO) test ./api/ -run XXX -fuzz FuzzHandlers -fuzztime 60s

# The reliability suite (docs/RELIABILITY.md): the crash loop with more
# rounds than make test runs, the guest faults, hostile clients and input.
reliability: export HAREBOX_TEST_DEFAULT_IMAGE = 1
reliability: export HAREBOX_TEST_IN_PROCESS = 1
reliability: export HAREBOX_CRASH_LOOP_N ?= 10
reliability: export HAREBOX_LOAD_SECONDS ?= 60
reliability: export HAREBOX_TEST_MOVE_KILLS ?= 20
reliability: deps
	$(GO) test -timeout 60m -count=1 -v -run 'TestCrashLoop|TestLoad|TestMoveKilled' ./e2e/host/
	$(GO) test -timeout 20m -count=1 -v -run 'TestGuestForkBomb|TestEngineKernelPanic|TestEngineDefaultImage|TestEngineKill9|TestEngineLifecycle/(AgentRestart|PluginCrash)|TestDataDirFull' .
	$(GO) test -timeout 10m -count=1 -v -run 'TestSlowAndMalformedClients' ./api/
	$(GO) test -timeout 20m -count=1 -run 'TestConformance$$' ./backends/qemu/
	$(GO) test ./api/ -run XXX -fuzz FuzzHandlers -fuzztime 60s

# The benchmarks on real VMs (e2e's, the side-by-side with gVisor) use the
# Debian image, as make test does; a package of them takes longer than go
# test's default 10 minutes; one package at a time, so that none measures
# beside another.
bench: export HAREBOX_TEST_DEFAULT_IMAGE = 1
bench: deps
	$(GO) test -p 1 -run XXX -bench . -benchtime 5x -timeout 90m ./...
	@echo "(ratios: engine/bare and engine/direct are the engine's overhead over the bare backend and the bare agent client)"

# Regenerates the gRPC code (needs protoc, protoc-gen-go, protoc-gen-go-grpc).
proto:
	protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative \
		agent/agentpb/agent.proto hypervisor/plugin/pluginpb/hypervisor.proto
	@# envd's .proto files are E2B's as they are (package names, field
	@# numbers): the Go packages are given by M flags, not an option in them.
	@# Generators: protoc (Debian's protobuf-compiler), go install
	@# google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12 and
	@# connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.21.1.
	cd e2b/envdpb && protoc -I . $(ENVD_PROTO_M:%=--go_opt=%) $(ENVD_PROTO_M:%=--connect-go_opt=%) \
		--go_out=. --go_opt=paths=source_relative --connect-go_out=. --connect-go_opt=paths=source_relative \
		process/process.proto filesystem/filesystem.proto

ENVD_PROTO_M := Mprocess/process.proto=github.com/harebox/harebox/e2b/envdpb/process \
	Mfilesystem/filesystem.proto=github.com/harebox/harebox/e2b/envdpb/filesystem

clean:
	rm -rf $(BIN) $(CACHE)
