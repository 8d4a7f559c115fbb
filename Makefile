# The test command is `make test` (README.md). It starts what the tests need.
.PHONY: test test-under-load demo bench bench-compare bench-load bench-peers soak robustness fuzz lint vulncheck console-screenshots alerts-check

test:
	./scripts/test.sh

# make test beside a CPU-bound load of LOAD_WORKERS busy threads (default
# 2 x the cores, tools/cpuload), as on a shared runner; prints make test's
# wall time and the load average at its start and end.
test-under-load:
	./scripts/test-under-load.sh

demo:
	go run ./examples/demo

# Benchmarks quick profile (about 5-10 minutes): writes benchmarks/RESULTS.md and overhead.png.
bench:
	./scripts/bench.sh

# Peers only (about 10 minutes, after make bench): the paired peer benchmarks
# -count 6 with benchstat and the execution counts; RESULTS.md again.
# Nothing slower: the benchmarks at BASE and at the working tree in turns on this
# machine (COMPARE_ROUNDS rounds, default 6), benchstat into benchmarks/results/compare.txt, linked from RESULTS.md (after make bench).
bench-compare:
	./scripts/bench.sh compare $(BASE)

bench-peers:
	./scripts/bench.sh peers

# Load over real sockets (about 6 minutes, after make bench): payments services on
# Gin and Fiber, idem vs each peer this module builds, per store, vegeta at LOAD_LEVELS workers (8,64,256)
# for LOAD_DURATION each (2s), LOAD_COUNT rounds (3, medians; the services' order
# rotated each round; LOAD_ONLY: comma-separated parts of the rows to run, e.g.
# lib=none,lib=idem/store=redis); generator and servers pinned to one CPU each.
bench-load:
	./scripts/bench.sh load

# Robustness (minutes, not part of make test): tests/model (record and journal models) with ROBUST_CHECKS random
# sequences per store (default 100), porcupine over histories recorded under toxiproxy
# faults and Redis restarts for ROBUST_DURATION per store (default 30s, seed ROBUST_SEED),
# and the engine's crash points on memstore and Redis. Prints, per store, the sequences
# and outcomes checked, the histories, operations, faults injected and anomalies found.
robustness:
	bash -c 'set -o pipefail; source scripts/services.sh && cd tests/model && RAPID_CHECKS=$${ROBUST_CHECKS:-100} go test -count=1 -timeout 60m -v . | grep -vE "^=== |^\s+(model|journal)_test.go:[0-9]+: \[rapid\]"'
	bash -c 'source scripts/services.sh && cd tests/robustness && go test -count=1 -timeout 60m -v ./linear/ -robust.duration=$${ROBUST_DURATION:-30s} -robust.seed=$${ROBUST_SEED:-1}'
	bash -c 'source scripts/services.sh && cd tests/robustness && go test -count=1 -timeout 30m -v ./crash/ | grep -vE "^=== "'

# Every Fuzz target of every module for FUZZTIME each (default 20s); `make test` runs their seeds.
fuzz:
	./scripts/fuzz.sh

# golangci-lint v2 (.golangci.yml) over every module.
lint:
	./scripts/lint.sh

# govulncheck over every module against an offline copy of the Go vulnerability database (also part of `make test`).
vulncheck:
	./scripts/vulncheck.sh

# Soak (minutes, not part of make test): three instances per store under mixed load
# with restarts (tests/chaos TestSoak), SOAK per store, default 3m; Redis Sentinel
# failovers under load, repeated for SOAK per case (TestSentinelFailover); and the
# broker chaos of examples/consumer with 300 payments and 60 consumer kills per broker;
# 500 payments per store killed mid-handler and finished by recoverers (examples/payments),
# behind HISTORY completed recoverable records per store but FerretDB (default 100000),
# 48 gRPC and Connect calls per door and store; the recovery soak (TestRecoverySoak): 200 payments/s
# per store for SOAK behind SOAK_HISTORY completed records (store=n,... of redis, postgres, mysql,
# mongo; default 1,000,000 on Redis, PostgreSQL and MySQL: the FerretDB test server scans its
# collection on every lookup and falls behind at 200 payments/s), an instance SIGKILLed
# mid-handler every 10s, figures into benchmarks/results/recovery-soak.txt and RESULTS.md section 11;
# 36 MCP tool calls per store (tests/mcp);
# the deterministic simulation (tests/sim) over SIM_SEEDS seeds (default 1,000,000: about 40 minutes on 2 idle cores).
soak:
	bash -c 'source scripts/services.sh && cd tests/chaos && go test -race -count=1 -timeout 30m -run "TestSoak|TestSentinelFailover" -v -soak=$${SOAK:-3m} .'
	bash -c 'source scripts/services.sh && cd examples/consumer && go test -count=1 -timeout 30m -run TestExactlyOnce -v -payments 300 -duplicates 100 -kills 60 .'
	bash -c 'source scripts/services.sh && cd tests/outbox && go test -count=1 -timeout 30m -run "TestChaosOutbox|TestClusterRelay|TestKafkaRelay|TestLoad" -v -soak .'
	bash -c 'source scripts/services.sh && cd examples/payments && go test -count=1 -timeout 60m -run "TestRecoverWithoutClients|TestRecoverRPC" -v -soak -history $${HISTORY:-100000} .'
	bash -c 'source scripts/services.sh && cd examples/payments && go test -count=1 -timeout 90m -run TestRecoverySoak -v -soak -soak-traffic $${SOAK:-3m} -soak-rate 200 -soak-kill-every 10s -soak-history $${SOAK_HISTORY:-redis=1000000,postgres=1000000,mysql=1000000} -soak-out $(CURDIR)/benchmarks/results/recovery-soak.txt .'
	./scripts/bench.sh report
	bash -c 'source scripts/services.sh && cd tests/mcp && go test -count=1 -timeout 30m -run TestRecoverMCP -v -soak .'
	cd tests/sim && go test -count=1 -timeout 12h -run 'TestSim$$' -v -sim.seeds=$${SIM_SEEDS:-1000000} .

# The console's screenshots in docs/console, taken by its browser test
# (tests/console) on Redis.
console-screenshots:
	bash -c 'source scripts/services.sh && cd tests/console && go test -count=1 -run TestConsoleSettlesACrashedPayment/redis . -args -screenshots $(CURDIR)/docs/console'

# The alerting rules of observability/idemotel/prometheus against their
# unit tests (promtool: Debian's prometheus package).
alerts-check:
	command -v promtool >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus)
	cd observability/idemotel/prometheus && promtool check rules idem-alerts.yml && promtool test rules idem-alerts.test.yml
