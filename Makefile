# The test command is `make test` (README.md). It starts what the tests need.
.PHONY: test demo bench

test:
	./scripts/test.sh

demo:
	go run ./examples/demo

# Benchmarks quick profile (about 5-10 minutes): writes benchmarks/RESULTS.md and overhead.png.
bench:
	./scripts/bench.sh
