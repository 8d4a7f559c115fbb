// Package idemgrpc is the gRPC adapter of idem: a unary server interceptor
// that runs each call at most once per idempotency key on an [idem.Engine]
// (the same engine, store and records as the HTTP adapters), and a unary
// client interceptor that sends one key per logical call and retries it
// safely.
//
//	e, err := idem.New(store)
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
//		recovery, auth, // outside idem
//		idemgrpc.UnaryServerInterceptor(e, idemgrpc.WithScope(userID)),
//	))
//
//	conn, err := grpc.NewClient(addr, grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor()))
//
// # What the server does
//
// The key is read from the request metadata "idempotency-key" (the engine's
// header name lowercased; [WithKeyMetadata]) with the HTTP header's syntax
// rules ([idem.ParseKey]); the scope is the principal [WithScope] returns
// and the full method name ("/payments.v1.Payments/Create"); the
// fingerprint covers the method and the request message in its
// deterministic protocol buffers encoding. A duplicate of a completed call
// gets the stored response message, decoded into its registered type, with
// the header and trailer metadata the handler set (grpc.SetHeader,
// grpc.SendHeader, grpc.SetTrailer inside the interceptor; "grpc-*",
// content-type, date and [WithUnstoredMetadata] names excluded) and
// "idempotent-replayed: true" in the header metadata. A stored error is
// replayed with its code, message and details. Streaming calls pass through
// untouched.
//
// The handler's outcome is recorded under an HTTP status ([HTTPStatus]),
// so the engine's store policy ([idem.WithStorePolicy], [idem.WithStoreAll])
// decides: by default OK and the deterministic client errors are stored,
// and Canceled, Aborted, ResourceExhausted, DeadlineExceeded, Unavailable,
// Unimplemented, Unknown, Internal and DataLoss release the key, so a retry
// executes again. A panic releases the key.
//
// # idem's own answers
//
// They are mapped from the engine's outcome ([idem.Outcome]), never from
// the HTTP status two outcomes may share; idemrpc.Code has the whole table:
//
//	outcome (HTTP answer)                    gRPC status          details (plus ErrorInfo{Domain: ErrorDomain, Reason})
//	key-missing, key-malformed (400)         InvalidArgument      BadRequest field violation on the metadata name
//	no-principal (401)                       Unauthenticated
//	in-progress (409)                        Aborted              RetryInfo (the engine's Retry-After)
//	key-reused (422)                         FailedPrecondition   PreconditionFailure{Type: "IDEMPOTENCY_KEY"}
//	fingerprint-changed (422)                FailedPrecondition   PreconditionFailure
//	operation-uncertain (409)                FailedPrecondition   PreconditionFailure; no RetryInfo
//	key-expired (410)                        FailedPrecondition   PreconditionFailure
//	replay-forbidden (403)                   PermissionDenied
//	body-too-large (413)                     ResourceExhausted
//	response-not-stored (410)                FailedPrecondition   ErrorInfo metadata original_status
//	store-unavailable (503)                  Unavailable          RetryInfo
//	stored-result-unreadable (500)           Internal
//
// A reused key is FailedPrecondition rather than InvalidArgument: the
// request is valid on its own and fails only against the state the key
// already holds, which is gRPC's definition of FailedPrecondition (and a
// client must not retry it unchanged). An uncertain outcome is
// FailedPrecondition too, without RetryInfo: the status code guide keeps
// Aborted for conflicts to "retry at a higher level" and FailedPrecondition
// for calls not to retry "until the system state has been explicitly
// fixed", here by an operator resolving the record. [UnaryClientInterceptor]
// retries by the ErrorInfo reason: in-progress and store-unavailable
// within the call's deadline (or [WithMaxElapsed]), nothing else of idem's.
//
// # Recovery without a client
//
// A method made recoverable with idemrpc.Recover(fullMethod, metadata...)
// keeps, from the acquire on, what running the call again takes: the
// request message, the principal, the idempotency key and the metadata
// lines named (never credentials). When the server running it stops
// (crashed, or stalled past its lease) and the client does not come back,
// an idem.Recoverer with [NewRunner]'s Run (idem.RecoverRequests) makes the
// call again over an in-memory listener to the same grpc.Server, through
// its interceptors and handler, carrying [RecoveryMetadata]; the
// authentication interceptor calls [RecoveryPrincipal] to authenticate it
// as the stored principal. Finished steps replay, and the answer is stored
// for the client's retry. A client sending [RecoveryMetadata] itself is
// answered PermissionDenied (reason RECOVERY_REFUSED), nothing executed:
//
//	e, err := idem.New(store, idemrpc.Recover("/payments.v1.Payments/Create", "x-tenant"))
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(auth, idemgrpc.UnaryServerInterceptor(e, idemgrpc.WithScope(userID))))
//	paymentsv1.RegisterPaymentsServer(srv, svc)
//	run, err := idemgrpc.NewRunner(srv)
//	rec, err := idem.NewRecoverer(e, idem.RecoverRequests(run.Run))
//	rec.Start()
//
// # Sharing records with HTTP and Connect
//
// The scope includes the route, here the full method name, so a payment
// created over HTTP (POST /v1/payments) and the same key sent to the gRPC
// method are two records: the two doors are different operations with
// different request encodings. idemconnect uses the same route, fingerprint
// and stored form (idemrpc.Outcome) as this package, so a call executed through grpc-go is
// replayed through connect-go (and the reverse) for the same procedure,
// principal and key.
package idemgrpc
