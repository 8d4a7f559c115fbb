package webhooks

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v82/webhook"

	"github.com/idemkit/idem/adapters/idemwebhook"
)

// The published Standard Webhooks test vector (the specification's
// libraries and Svix's docs): our signed header carries it, and the scheme
// accepts it at its own time.
func TestStandardWebhooksVector(t *testing.T) {
	std, _ := schemes(t)
	body := []byte(`{"test": 2432232314}`)
	ts := time.Unix(1614265330, 0)
	h := std.SignedHeader("msg_p5jXN8AQM9LWM0D4loKWxJek", ts, body)
	if got, want := h.Get("webhook-signature"), "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="; got != want {
		t.Fatalf("signature %q, want %q", got, want)
	}
	d, err := std.Verify(h, body, ts.Add(4*time.Minute))
	if err != nil || d.ID != "msg_p5jXN8AQM9LWM0D4loKWxJek" || !d.Timestamp.Equal(ts) {
		t.Fatalf("Verify = %+v, %v", d, err)
	}
	// Rotation: a list of signatures, one of them matching, verifies.
	h.Set("webhook-signature", "v1,Zm9yZ2VkIHNpZ25hdHVyZSBmb3Igcm90YXRpb24gdGVzdHM= "+h.Get("webhook-signature")+" v1a,c29tZXRoaW5n")
	if _, err := std.Verify(h, body, ts); err != nil {
		t.Fatalf("signature list: %v", err)
	}
}

// Our Stripe scheme and stripe-go's webhook package agree in both
// directions: stripe-go's test signer is accepted, our signed header passes
// stripe-go's ValidatePayload, and a wrong secret or an old timestamp is
// refused by both.
func TestStripeAgainstStripeGo(t *testing.T) {
	_, st := schemes(t)
	body := stripeBody("evt_1Qx2stripego")
	now := time.Now()
	p := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: stripeSecret, Timestamp: now})
	d, err := st.Verify(http.Header{"Stripe-Signature": {p.Header}}, body, now)
	if err != nil || d.ID != "evt_1Qx2stripego" || d.Timestamp.Unix() != now.Unix() {
		t.Fatalf("stripe-go's signed payload: %+v, %v", d, err)
	}
	ours := st.SignedHeader(now, body).Get("Stripe-Signature")
	if ours != p.Header {
		t.Errorf("our header %q, stripe-go's %q", ours, p.Header)
	}
	if err := webhook.ValidatePayloadWithTolerance(body, ours, stripeSecret, webhook.DefaultTolerance); err != nil {
		t.Errorf("stripe-go refuses our header: %v", err)
	}
	// A second v1 (secret rolled) and a v0 entry, as Stripe may send.
	other := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: "whsec_old", Timestamp: now})
	_, sig, _ := strings.Cut(p.Header, "v1=")
	mixed := other.Header + ",v1=" + sig + ",v0=6ffbb59b2300aae63f272406069a9788598b792a944a07aba816edb039989a39"
	if _, err := st.Verify(http.Header{"Stripe-Signature": {mixed}}, body, now); err != nil {
		t.Errorf("header with two v1 and a v0: %v", err)
	}
	forged := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: "whsec_other", Timestamp: now})
	if _, err := st.Verify(http.Header{"Stripe-Signature": {forged.Header}}, body, now); !errors.Is(err, idemwebhook.ErrSignature) {
		t.Errorf("other secret: %v", err)
	}
	if webhook.ValidatePayload(body, forged.Header, stripeSecret) == nil {
		t.Errorf("stripe-go accepts the other secret")
	}
	old := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: stripeSecret, Timestamp: now.Add(-301 * time.Second)})
	if _, err := st.Verify(http.Header{"Stripe-Signature": {old.Header}}, body, now); !errors.Is(err, idemwebhook.ErrTimestamp) {
		t.Errorf("301 s old: %v", err)
	}
	if !errors.Is(webhook.ValidatePayload(body, old.Header, stripeSecret), webhook.ErrTooOld) {
		t.Errorf("stripe-go accepts 301 s old")
	}
}

// Each scheme's verdicts: malformed headers, forged and tampered
// deliveries, the tolerance in both directions and its option.
func TestSchemeVerdicts(t *testing.T) {
	std, st := schemes(t)
	now := time.Now()
	sbody, pbody := standardBody("msg_1"), stripeBody("evt_1")
	cases := []struct {
		name   string
		scheme idemwebhook.Scheme
		header http.Header
		body   []byte
		want   error
	}{
		{"standard/ok", std, std.SignedHeader("msg_1", now, sbody), sbody, nil},
		{"standard/no headers", std, http.Header{}, sbody, idemwebhook.ErrMalformed},
		{"standard/bad timestamp", std, withHeader(std.SignedHeader("msg_1", now, sbody), "Webhook-Timestamp", "soon"), sbody, idemwebhook.ErrMalformed},
		{"standard/tampered body", std, std.SignedHeader("msg_1", now, sbody), standardBody("msg_2"), idemwebhook.ErrSignature},
		{"standard/other id", std, withHeader(std.SignedHeader("msg_1", now, sbody), "Webhook-Id", "msg_2"), sbody, idemwebhook.ErrSignature},
		{"standard/old", std, std.SignedHeader("msg_1", now.Add(-5*time.Minute-time.Second), sbody), sbody, idemwebhook.ErrTimestamp},
		{"standard/future", std, std.SignedHeader("msg_1", now.Add(5*time.Minute+time.Second), sbody), sbody, idemwebhook.ErrTimestamp},
		{"standard/edge of window", std, std.SignedHeader("msg_1", now.Add(-5*time.Minute+time.Second), sbody), sbody, nil},
		{"stripe/ok", st, st.SignedHeader(now, pbody), pbody, nil},
		{"stripe/no header", st, http.Header{}, pbody, idemwebhook.ErrMalformed},
		{"stripe/no t", st, http.Header{"Stripe-Signature": {"v1=00"}}, pbody, idemwebhook.ErrMalformed},
		{"stripe/not pairs", st, http.Header{"Stripe-Signature": {"garbage"}}, pbody, idemwebhook.ErrMalformed},
		{"stripe/no v1", st, http.Header{"Stripe-Signature": {"t=" + unix(now)}}, pbody, idemwebhook.ErrSignature},
		{"stripe/tampered", st, st.SignedHeader(now, pbody), stripeBody("evt_2"), idemwebhook.ErrSignature},
		{"stripe/old", st, st.SignedHeader(now.Add(-10*time.Minute), pbody), pbody, idemwebhook.ErrTimestamp},
		{"stripe/future", st, st.SignedHeader(now.Add(10*time.Minute), pbody), pbody, idemwebhook.ErrTimestamp},
		{"stripe/no id", st, st.SignedHeader(now, []byte(`{"object":"event"}`)), []byte(`{"object":"event"}`), idemwebhook.ErrMalformed},
		{"stripe/not json", st, st.SignedHeader(now, []byte(`evt_1`)), []byte(`evt_1`), idemwebhook.ErrMalformed},
	}
	for _, c := range cases {
		_, err := c.scheme.Verify(c.header, c.body, now)
		if c.want == nil && err != nil || c.want != nil && !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	wide, err := idemwebhook.NewStripe(stripeSecret, idemwebhook.WithTolerance(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wide.Verify(st.SignedHeader(now.Add(-10*time.Minute), pbody), pbody, now); err != nil {
		t.Errorf("WithTolerance(1h), 10 min old: %v", err)
	}
	if _, err := idemwebhook.NewStripe(stripeSecret, idemwebhook.WithTolerance(0)); err == nil {
		t.Errorf("WithTolerance(0) accepted")
	}
	if _, err := idemwebhook.NewStripe(""); err == nil {
		t.Errorf("empty Stripe secret accepted")
	}
	if _, err := idemwebhook.NewStandardWebhooks("whsec_not base64!"); err == nil {
		t.Errorf("Standard Webhooks secret that is not base64 accepted")
	}
}

func withHeader(h http.Header, k, v string) http.Header { h.Set(k, v); return h }

func unix(t time.Time) string { return strconv.FormatInt(t.Unix(), 10) }
