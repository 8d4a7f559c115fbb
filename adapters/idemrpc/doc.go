// Package idemrpc is what the RPC adapters of idem share (idemgrpc for
// grpc-go, idemconnect for connect-go), free of either framework: the
// stored form of a unary call's outcome ([Outcome]), so that both read each
// other's records; the table from status codes to the HTTP statuses the
// engine's store policy decides on ([HTTPStatus]); idem's own answers as
// google.rpc statuses by the engine's outcome ([Answer], [Code], [Reason]);
// and the client's retry rule ([Retry], [Budget], [Backoff]). Applications use the adapters; they need this package only
// to make a procedure recoverable without a client ([Recover]), to write a
// store policy by code ([HTTPStatus]) or another RPC adapter.
package idemrpc

// FingerprintType is the content type the engine fingerprints a request
// message under: its deterministic protocol buffers encoding, whatever
// codec and protocol carried it, so that a retry may switch between them.
const FingerprintType = "application/proto"
