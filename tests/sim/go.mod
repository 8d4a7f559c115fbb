module github.com/idemkit/idem/tests/sim

go 1.26.0

require github.com/idemkit/idem/core v0.1.0

replace github.com/idemkit/idem/core => ../../core

require github.com/idemkit/idem/stores/memstore v0.1.0

replace github.com/idemkit/idem/stores/memstore => ../../stores/memstore

require github.com/idemkit/idem/adapters/idemhttp v0.1.0

replace github.com/idemkit/idem/adapters/idemhttp => ../../adapters/idemhttp
