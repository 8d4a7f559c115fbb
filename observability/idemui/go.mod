module github.com/idemkit/idem/observability/idemui

go 1.26.0

require github.com/idemkit/idem/core v0.1.0

replace github.com/idemkit/idem/core => ../../core
