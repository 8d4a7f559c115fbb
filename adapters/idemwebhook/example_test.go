package idemwebhook_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log"
	"net/http"
	"strings"
	"time"

	"github.com/idemkit/idem/adapters/idemwebhook"
	idem "github.com/idemkit/idem/core"
)

// store is the application's [idem.Store]: memstore.New() for one process,
// redisstore, mongostore, pgstore or mysqlstore for several. The example
// leaves it unset so that this module does not require a store module (the
// runnable receiver is examples/webhooks).
var store idem.Store

func Example() {
	engine, err := idem.New(store, idem.WithRetention(4*24*time.Hour)) // longer than Stripe's 3 days of retries
	if err != nil {
		log.Fatal(err)
	}
	stripe, err := idemwebhook.NewStripe("whsec_from_the_dashboard")
	if err != nil {
		log.Fatal(err)
	}
	standard, err := idemwebhook.NewStandardWebhooks("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		log.Fatal(err)
	}
	handle := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, _ := idemwebhook.DeliveryFromContext(r.Context())
		// Process the event d.ID from d.Sender once: r.Body holds the verified bytes.
		fmt.Fprintf(w, "processed %s\n", d.ID)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /webhooks/stripe", idemwebhook.New(engine, "stripe", stripe)(handle))
	mux.Handle("POST /webhooks/billing", idemwebhook.New(engine, "billing", standard)(handle))
	_ = mux // http.ListenAndServe(":8080", mux)
}

// A scheme of your own: GitHub signs the body with HMAC-SHA256
// (X-Hub-Signature-256: sha256=<hex>) and names each delivery in
// X-GitHub-Delivery; it signs no timestamp, so there is no window against
// a replayed old delivery, only the idempotency key within the retention.
func ExampleSchemeFunc() {
	secret := []byte("github-webhook-secret")
	github := idemwebhook.SchemeFunc(func(h http.Header, body []byte, _ time.Time) (idemwebhook.Delivery, error) {
		id := h.Get("X-GitHub-Delivery")
		got, ok := strings.CutPrefix(h.Get("X-Hub-Signature-256"), "sha256=")
		if id == "" || !ok {
			return idemwebhook.Delivery{}, fmt.Errorf("%w: X-GitHub-Delivery and X-Hub-Signature-256 are required", idemwebhook.ErrMalformed)
		}
		m := hmac.New(sha256.New, secret)
		m.Write(body)
		if sig, err := hex.DecodeString(got); err != nil || !hmac.Equal(sig, m.Sum(nil)) {
			return idemwebhook.Delivery{}, idemwebhook.ErrSignature
		}
		return idemwebhook.Delivery{ID: id}, nil
	})
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(`{"action":"opened"}`))
	h := http.Header{"X-Github-Delivery": {"72d3162e-cc78-11e3-81ab-4c9367dc0958"}, "X-Hub-Signature-256": {"sha256=" + hex.EncodeToString(m.Sum(nil))}}
	d, err := github.Verify(h, []byte(`{"action":"opened"}`), time.Now())
	fmt.Println(d.ID, err)
	// Output: 72d3162e-cc78-11e3-81ab-4c9367dc0958 <nil>
}
