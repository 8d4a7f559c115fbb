module github.com/idemkit/idem/adapters/idemwebhook

go 1.24

require (
	github.com/idemkit/idem/core v0.1.0
	github.com/standard-webhooks/standard-webhooks/libraries v1.3.0
)

replace github.com/idemkit/idem/core => ../../core
