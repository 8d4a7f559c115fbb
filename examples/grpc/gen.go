package main

// Generated code (gen/) is committed. To regenerate, install the tools:
//
//	apt-get install protobuf-compiler   # protoc (Debian 12: 3.21.12)
//	go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
//	go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
//	go install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.21.1
//
// then run go generate ./examples/grpc from the repository root.
//go:generate protoc -I proto --go_out=. --go_opt=module=github.com/idemkit/idem/examples/grpc --go-grpc_out=. --go-grpc_opt=module=github.com/idemkit/idem/examples/grpc --connect-go_out=. --connect-go_opt=module=github.com/idemkit/idem/examples/grpc payments/v1/payments.proto
