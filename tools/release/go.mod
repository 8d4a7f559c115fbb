module github.com/idemkit/idem/tools/release

go 1.24.0

require (
	github.com/google/licensecheck v0.3.1
	golang.org/x/mod v0.30.0
)
