module github.com/idemkit/idem/core

go 1.24
