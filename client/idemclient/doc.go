// Package idemclient is the client half of idem: an http.RoundTripper that
// sends one idempotency key per logical request (IETF draft "The
// Idempotency-Key HTTP Header Field") and retries the request while that is
// safe, so that a payment is charged once however often the network fails.
//
// # Using it
//
//	client := &http.Client{Transport: idemclient.New()}
//	resp, err := client.Post(url, "application/json", body) // key, retries, replay
//
// Every attempt of one call carries the same Idempotency-Key and the same
// body bytes; two calls get two keys. Fix the key yourself with a header,
// with [WithKey], or derive it from your own durable ids with [Key] so that a
// process that restarts sends it again:
//
//	ctx = idemclient.WithKey(ctx, idemclient.Key(userID, orderID))
//
// # Retries
//
// [ClassifyResponse] and [ClassifyError] decide, [ParseRetryAfter] and
// [Backoff] set the wait: idem's in-progress and store-unavailable answers
// (told apart by their problem type, since 409 is also
// operation-uncertain), 425, 429, 502, 504, other servers' 409, 500 and 503, and
// transport failures are retried, honouring Retry-After up to a cap, else
// with exponential backoff and full jitter. idem's final answers about the
// key (operation-uncertain, key-expired, replay-forbidden, key-reused,
// fingerprint-changed, stored-result-unreadable) stop at once with an
// [*OutcomeError] (errors.Is with [ErrUncertain], [ErrKeyExpired], ...);
// every other status is returned as it is.
// Retries are budgeted in time, not attempts: a server that restarts
// (a deploy, a rescheduled pod) refuses connections for seconds, and after
// a crash the service answers 409 in-progress until the crashed holder's
// lease lapses (up to its lease, 30s by default) and a retry takes the
// execution over. So the Transport retries transport failures, 425, 429, 502,
// 503, 504 and in-progress answers (idem's 409 in-progress, another
// server's 409), as Retry-After says or with backoff (up to 5s), for
// [WithMaxElapsed] (default 1m: the default lease plus a 30s margin for
// the takeover's execution) or until the request context's deadline,
// whichever ends first. A 500 (the handler ran and failed) is sent
// [DefaultMaxAttempts] (5) times at most; [WithMaxAttempts] is the opt-in
// count of every failed attempt. A failure no retry fixes (a DNS name not
// found, a refused TLS certificate: idem.RetryCannotFix) ends at once.
// When the budget or the request context ends first the error is a
// [*GaveUpError] carrying the key, the last status or error and the reason
// (errors.Is with [ErrAttemptsExhausted], [ErrOutOfTime],
// [ErrRetryAfterTooLong], [ErrBodyNotReplayable] or the context's error),
// and saying how to resume: calling again later with the same key
// ([WithKey]) is safe and gets the one execution's answer. A reply
// cut inside its body surfaces on the caller's read, unless
// [WithResponseBuffer] reads final bodies first and retries such cuts too.
//
// # What a response tells
//
// A final response is returned as the server sent it. [Replayed] reports
// whether it is a stored answer replayed by the server (Idempotent-Replayed:
// true), [Attempts] how many attempts it took and [RequestKey] the key it
// was sent with; they read the response's Request, the last attempt.
// [WithAttemptHook] sees every attempt, for logs and metrics; both count
// the re-sends net/http's transport makes by itself on a broken keep-alive
// connection ([ErrResent]).
//
// # Other retrying clients
//
// The Transport retries by itself. Put it under another retrying layer
// (go-retryablehttp, failsafe-go, resty) only with that layer's retries off,
// or the layers multiply their attempts; a layer above that retries a whole
// call should pass the key from the first call ([RequestKey] or the
// GaveUpError's Key) back with [WithKey], else each of its retries is a new
// logical request.
package idemclient
