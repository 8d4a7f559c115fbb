// Package idemconnect is the Connect (connectrpc.com/connect) adapter of
// idem: a handler interceptor that runs each unary call at most once per
// idempotency key on an [idem.Engine] (the same engine, store and records
// as the HTTP adapters and idemgrpc), on all three protocols Connect serves
// (Connect, gRPC, gRPC-Web), and a client interceptor that sends one key per
// logical call and retries it safely.
//
//	e, err := idem.New(store)
//	path, handler := paymentsv1connect.NewPaymentsHandler(svc, connect.WithInterceptors(
//		idemconnect.NewInterceptor(e, idemconnect.WithScope(userID)),
//	))
//	mux.Handle(path, auth(handler)) // authentication outside: it stores the principal
//
//	client := paymentsv1connect.NewPaymentsClient(http.DefaultClient, url,
//		connect.WithInterceptors(idemconnect.NewClientInterceptor()))
//
// The key is the request header Idempotency-Key (the engine's header;
// [WithKeyHeader]), with the HTTP header's syntax rules; the scope is the
// principal [WithScope] returns and the procedure ("/payments.v1.Payments/Create");
// the fingerprint covers the procedure and the request message in its
// deterministic protocol buffers encoding, so a retry may switch between
// protocols and codecs (JSON or binary) and still match. Outcomes are
// recorded under [HTTPStatus] of their code (idemrpc.HTTPStatus table:
// OK and deterministic client errors stored, Canceled, Aborted,
// ResourceExhausted, DeadlineExceeded, Unavailable, Unimplemented, Unknown,
// Internal and DataLoss released), and idem's own answers are Connect
// errors with google.rpc details, by the engine's outcome, as in idemgrpc
// (idemrpc.Code's table): InvalidArgument (BadRequest) for a missing or
// malformed key, Unauthenticated without a principal, Aborted with
// RetryInfo (and Retry-After) while the key is in progress,
// FailedPrecondition (PreconditionFailure) for a key reused with another
// request, a changed fingerprint function, an uncertain outcome (reason
// OPERATION_UNCERTAIN, no RetryInfo) or an expired key (KEY_EXPIRED),
// PermissionDenied for a refused replay, Unavailable with RetryInfo when
// the store is down. [NewClientInterceptor] retries in-progress answers
// within the call's deadline and never the final ones.
// Records, routes, fingerprints and the stored form are those of idemgrpc:
// a call executed through grpc-go is replayed through connect-go and the
// reverse.
//
// # Recovery without a client
//
// A procedure made recoverable with idemrpc.Recover(procedure, headers...)
// is finished by an idem.Recoverer when its server stopped and its client
// does not come back: [Runner] runs the call again through the handler
// in-process (the Connect protocol), carrying idem.RecoveryHeader, which
// the service's authentication hands to idem.Engine.RecoveryPrincipal as
// on HTTP; the answer is stored for the client's retry. A client sending
// that header itself is answered CodePermissionDenied, nothing executed.
//
// # Why not idemhttp
//
// idemhttp mounted around a Connect handler does protect the Connect
// protocol's unary calls (a POST per call, status in the HTTP status) and
// stores and replays them; but its own answers are RFC 9457 problems, which
// Connect clients read only by HTTP status (a missing key becomes
// CodeInternal, a call in progress CodeUnknown, without RetryInfo), and on
// the gRPC and gRPC-Web protocols every outcome is HTTP 200 with the status
// in trailers, so errors would be stored as successes. This interceptor
// sees the decoded message and the Connect error instead, on every
// protocol.
package idemconnect
