module github.com/idemkit/idem/stores/memstore

go 1.24

require github.com/idemkit/idem/core v0.1.0

require go.uber.org/goleak v1.3.0

replace github.com/idemkit/idem/core => ../../core
