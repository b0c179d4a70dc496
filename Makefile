export GOEXPERIMENT := simd

.PHONY: demo test check proto build bench fuzz

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

bench:
	go test -run '^$$' -bench . -benchmem ./...
