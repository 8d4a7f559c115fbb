module github.com/idemkit/idem/adapters/idemhttp

go 1.24

require github.com/idemkit/idem/core v0.1.0

replace github.com/idemkit/idem/core => ../../core
