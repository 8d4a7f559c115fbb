module github.com/idemkit/idem/adapters/idemconnect

go 1.26.0

require github.com/idemkit/idem/core v0.1.0

require (
	connectrpc.com/connect v1.21.1 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261110000943-09e21b237f2c // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

replace github.com/idemkit/idem/core => ../../core
