export GOEXPERIMENT := simd
# Build the MuJoCo binding (internal/mujoco) when Debian's libmujoco-dev is
# installed; the same rule as scripts/gotags.sh.
ifneq ($(wildcard /usr/include/mujoco/mujoco.h),)
ifeq ($(findstring -tags,$(GOFLAGS)),)
export GOFLAGS := $(strip $(GOFLAGS) -tags=mujoco)
endif
endif

.PHONY: demo test check proto build bench benchref fuzz mujoco-check compat

# The main job: a complete distributed training run on the embedded hub.
demo: build
	scripts/demo.sh

# Everything CI runs: set-up, repo checks, go test -race, pytest.
test:
	scripts/test.sh

check:
	scripts/check.sh

proto:
	scripts/genproto.sh

build:
	go build -o bin/rlhub ./cmd/rlhub

# The Go MuJoCo tasks against Gymnasium's own v5 envs, 5000 steps each
# (STEPS=N to change); needs pip (makes a virtualenv with mujoco 2.3.7).
mujoco-check:
	scripts/mujoco_check.sh

# Every fuzz target in the repo, 10 s each (FUZZTIME=5m for longer); not in CI.
fuzz:
	scripts/fuzz.sh

# A rolling upgrade between BASE=REV (the build running now) and this
# checkout: hubs of both builds in one cluster, each killed in turn.
compat:
	scripts/compat.sh

bench:
	go test -run '^$$' -bench . -benchmem ./...

# docs/benchmarks.md: one table of current figures per component.
benchref:
	python3 scripts/benchref.py
