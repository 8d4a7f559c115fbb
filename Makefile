# The test command is `make test` (README.md). It starts what the tests need.
.PHONY: test demo

test:
	./scripts/test.sh

demo:
	go run ./examples/demo
