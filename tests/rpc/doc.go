// Package rpc holds no code: its tests exercise adapters/idemgrpc and
// adapters/idemconnect on real gRPC and Connect servers over TCP, with the
// memory store and Redis (behind toxiproxy for store outages), and the
// client interceptors through a faulty proxy. They live in this module, not
// in the adapters' own, so that stores, toxiproxy and goleak stay out of the
// module graph of an application that imports an adapter.
package rpc
