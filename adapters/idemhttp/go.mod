module github.com/idemkit/idem/adapters/idemhttp

go 1.24

require github.com/idemkit/idem/core v0.1.0

replace github.com/idemkit/idem/core => ../../core

require github.com/idemkit/idem/stores/memstore v0.1.0

require go.uber.org/goleak v1.3.0

replace github.com/idemkit/idem/stores/memstore => ../../stores/memstore
