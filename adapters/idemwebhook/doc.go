// Package idemwebhook receives webhooks with idem: each event a sender
// delivers is processed at most once, however often the sender delivers it
// (senders deliver at least once, retry every answer that is not 2xx, and
// sometimes deliver one event twice at the same time).
//
// The receiver is net/http middleware built on idem's net/http path (the
// engine's Begin, Capture and Finish, as adapters/idemhttp uses them); the
// engine decides, the receiver translates. For each POST it
//
//  1. reads the body once, at most [WithMaxBodyBytes] (1 MiB);
//  2. verifies the delivery with a [Scheme] before any store call:
//     [StandardWebhooks] (webhook-id, webhook-timestamp, webhook-signature)
//     or [Stripe] (Stripe-Signature), each with a tolerance window on the
//     signed timestamp ([DefaultTolerance], 5 minutes), or any scheme of
//     yours;
//  3. runs the handler at most once per event id (Standard Webhooks'
//     webhook-id, a Stripe event's "id"), scoped by the sender's name and
//     the route, fingerprinted by the body bytes;
//  4. answers what a sender understands.
//
// # Answers
//
//	delivery                                  answer
//	first delivery of an event                the handler's answer (2xx stored; 5xx releases the event: the retry runs again)
//	redelivery of a processed event           the stored answer, with Idempotent-Replayed: true
//	redelivery while the event is processed   503 webhook-in-progress with Retry-After (never 409)
//	redelivery after the retention, tombstone 200 with Idempotent-Replayed: true (idem.WithTombstones; never 410)
//	signature does not match                  400 webhook-signature-invalid, nothing stored
//	timestamp outside the tolerance           400 webhook-timestamp-outside-tolerance (a replay of an old delivery)
//	headers or event id missing, not POST     400 webhook-malformed (405 with Allow: POST for other methods)
//	body over the limit                       413 body-too-large
//	same event id, another body               422 key-reused, nothing processed
//	store down or too slow                    503 store-unavailable with Retry-After, nothing processed
//	a Scheme error that is not a verdict      503 webhook-verification-failed
//
// 409 and 410 never reach a sender: some disable an endpoint on them
// (Standard Webhooks: 410 Gone means "stop sending"). 4xx answers are for
// deliveries that will never verify or parse; everything that may succeed
// later is 5xx with Retry-After.
//
// The same event id with another body is refused (422) rather than
// acknowledged: Stripe and Standard Webhooks senders redeliver the
// identical body (only the timestamp and signature are new), so another
// body under a verified id is a sender's bug or a leaked secret, and
// acknowledging it would drop an event silently. A sender that
// re-serialises its JSON between attempts needs a route fingerprint:
// idem.WithRoute("POST", route, idem.RouteFingerprint(idem.JSONFingerprint())).
//
// # Retention
//
// Senders retry for days, signing each attempt anew, so the timestamp
// window does not end them: the engine's retention must outlast the
// sender's retry schedule, or a late retry runs again. Stripe retries for
// up to 3 days, the Standard Webhooks example schedule ends after 75 hours,
// Svix's after about 28: use idem.WithRetention(4 * 24 * time.Hour) (the
// default is 24 hours) on the engine the receivers use.
//
// # Mounting
//
// Mount it per endpoint, after nothing that reads the body:
//
//	mux.Handle("POST /webhooks/stripe", idemwebhook.New(engine, "stripe", stripeScheme)(handler))
//
// Gin, Echo and Fiber mount net/http handlers through their bridges:
//
//	r.POST("/webhooks/stripe", gin.WrapH(h))             // Gin
//	e.POST("/webhooks/stripe", echo.WrapHandler(h))      // Echo v4 and v5
//	app.Post("/webhooks/stripe", adaptor.HTTPHandler(h)) // Fiber v2 (fiber/v2/middleware/adaptor); Fiber v3 takes h as it is
//
// An app-wide idem middleware must skip webhook routes (idemhttp.WithSkip,
// idemgin.WithSkipper, idemecho.WithSkipper, idemfiber.WithNext): senders send no Idempotency-Key. Give the
// receivers an engine of their own (it may share the store): its options
// (retention, a key validator, a problem renderer) then suit senders, not
// API clients.
package idemwebhook
