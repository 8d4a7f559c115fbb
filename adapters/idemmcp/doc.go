// Package idemmcp makes MCP tool calls that move state (payments,
// transfers, orders) safe for agents to retry: a server middleware for
// github.com/modelcontextprotocol/go-sdk runs each call of a mutating tool
// at most once per idempotency key and replays its stored result to
// retries; a client helper gives each logical call one key across the
// agent runtime's retries.
//
//	server := mcp.NewServer(&mcp.Implementation{Name: "payments"}, nil)
//	mcp.AddTool(server, createPayment, handleCreatePayment)
//	mcp.AddTool(server, getBalance, handleGetBalance) // ReadOnlyHint: untouched
//	server.AddReceivingMiddleware(idemmcp.Middleware(engine, idemmcp.WithTools(createPayment, getBalance)))
//
//	agent := idemmcp.NewClient(func(ctx context.Context) (*mcp.ClientSession, error) {
//		return client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url}, nil)
//	}, idemmcp.WithAttemptTimeout(10*time.Second))
//	res, err := agent.CallTool(ctx, &mcp.CallToolParams{Name: "create_payment", Arguments: args})
//
// # Spec status
//
// MCP (specification 2025-11-25 and 2026-07-28) has no idempotency key.
// What is standard and used here: the _meta member of tools/call params
// and of results (free for implementations to use, names under
// io.modelcontextprotocol/ reserved), JSON-RPC errors with a data member,
// the tool annotations readOnlyHint and idempotentHint (hints the server
// sets for its own tools), and auth.TokenInfo on the streamable HTTP
// transport. What is not: SEP-3182 "Request Idempotency"
// (modelcontextprotocol/modelcontextprotocol pull request 3182, status
// "proposal"; the pull request is closed and the specification has no
// such field) proposes a top-level
// params.idempotencyKey on tools/call with a tools.idempotency capability.
// The go-sdk's typed params (CallToolParams, CallToolParamsRaw) have no
// such field: a client cannot send it and a server middleware cannot read
// it. So the key travels in _meta under the proposal's name
// (_meta.idempotencyKey, [MetaKey]), the form earlier proposals and demos
// used; a server can also take it from a tool argument ([WithKeyArgument]).
// An agent runtime that does not know this convention sends no key and is
// refused by default ([WithKeyOptional] to run such calls unprotected).
//
// What follows SEP-3182's text: a duplicate gets the stored result,
// including one with isError; a duplicate while the first call runs is
// rejected at once, never run and never blocked (unless the engine has
// idem.WithWait); a key reused with other arguments is rejected; both
// rejections are JSON-RPC errors whose error.data has a type,
// "idempotency_key_in_progress" and "idempotency_key_conflict", and the
// key; keys are scoped by the caller's authorization boundary; retention
// is the engine's (idem.WithRetention, 24 hours by default): document it
// for your integrators. Where this package differs: arguments are compared
// by core's canonical JSON, in which numbers compare as written (1.0 is
// not 1; SEP-3182 asks for equality by value); the tools.idempotency
// capability is not advertised (the go-sdk's ToolCapabilities has no
// field for it); and the other refusals below are this package's own.
//
// # Answers
//
// Every answer that is not the tool's own result is a JSON-RPC error with
// an [ErrorData] in error.data ([ErrorDataOf] reads it). JSON-RPC errors,
// not isError results, because SEP-3182 specifies them and because they
// are not the tool's outcome: an agent runtime hands isError content to
// the model as what the tool did.
//
//	type                             code    retry with the same key
//	idempotency_key_missing          -32602  no: send a key
//	idempotency_key_malformed        -32602  no
//	idempotency_no_principal         -32603  no
//	idempotency_key_in_progress      -32603  yes, after retryAfterSeconds: gets the result
//	idempotency_key_conflict         -32602  no: new call, new key
//	idempotency_outcome_uncertain    -32603  no: an operator resolves it
//	idempotency_key_expired          -32603  no
//	idempotency_result_not_stored    -32603  no: it ran once
//	idempotency_store_unavailable    -32603  yes: nothing ran
//	idempotency_record_unreadable    -32603  no
//
// # Which tools
//
// [WithTools] takes the server's *mcp.Tool values and guards those whose
// annotations do not say readOnlyHint or idempotentHint (a tool without
// annotations is, by MCP's defaults, neither); [WithToolNames] names tools
// outright. Other tools and other methods pass through untouched.
//
// # Recovery without an agent
//
// A tool named in [WithRecovery] keeps its call's arguments, principal
// and key in the record; when the server running the call stops (crashed,
// or stalled past its lease), the idem.Recoverer given runs the tool's
// handler again with them, in a session of its own, finished steps
// replayed, and stores the result: the agent's retry, whenever it comes,
// gets it with _meta[ReplayedMetaKey]. Agents are the clients least likely
// to come back (a cancelled run, a context window that moved on).
//
//	rec, err := idem.NewRecoverer(engine)
//	server.AddReceivingMiddleware(idemmcp.Middleware(engine, idemmcp.WithTools(createPayment),
//		idemmcp.WithRecovery(rec, server, "create_payment")))
//	rec.Start()
//
// # Scope
//
// A key belongs to the principal that sent it (SEP-3182, "Security
// Implications"): the UserID of the request's auth.TokenInfo (set by
// auth.RequireBearerToken on the streamable HTTP transport), else the
// [WithScope] function's answer (stdio servers, other authentication).
// A call with neither is refused unless the engine has
// idem.WithGlobalScope. Several server instances share records through a
// shared store (redisstore, pgstore, mongostore, mysqlstore); a
// process-local memstore protects one process only.
package idemmcp
