module github.com/idemkit/idem/adapters/idemconnect

go 1.26.0

require (
	connectrpc.com/connect v1.21.1
	github.com/idemkit/idem/adapters/idemrpc v0.1.0
	github.com/idemkit/idem/core v0.1.0
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261110000943-09e21b237f2c
	google.golang.org/protobuf v1.36.12
)

replace (
	github.com/idemkit/idem/adapters/idemrpc => ../idemrpc
	github.com/idemkit/idem/core => ../../core
)
