package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem/adapters/idemwebhook"
)

// maxWait caps how long a simulated sender waits before a retry. Real
// senders wait at least Retry-After (1 s here) and often minutes; the demo
// caps it so that it ends in seconds.
const maxWait = 250 * time.Millisecond

// sender simulates one webhook sender: it signs each attempt anew and
// retries every non-2xx answer until a 2xx, as Stripe and Standard
// Webhooks senders do.
type sender struct {
	name, path string
	sign       func(id string, t time.Time, body []byte) http.Header
	body       func(id string) []byte
	base       string
	client     *http.Client
	out        io.Writer
	outMu      *sync.Mutex
}

func newID(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// simulateSenders delivers o.events events from each sender, o.copies at
// once, plus a delivery cut mid-processing, a forged one and a replayed old
// one, and returns the events sent ("sender/id").
func simulateSenders(ctx context.Context, base string, o options, out io.Writer) ([]string, error) {
	stripe, err := idemwebhook.NewStripe(stripeSecret)
	if err != nil {
		return nil, err
	}
	billing, err := idemwebhook.NewStandardWebhooks(billingSecret)
	if err != nil {
		return nil, err
	}
	client := &http.Client{Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	var outMu sync.Mutex
	senders := []*sender{
		{name: "stripe", path: "/webhooks/stripe", base: base, client: client, out: out, outMu: &outMu,
			sign: func(_ string, t time.Time, body []byte) http.Header { return stripe.SignedHeader(t, body) },
			body: func(id string) []byte {
				return []byte(`{"id":"` + id + `","object":"event","type":"payment_intent.succeeded","data":{"object":{"id":"pi_` + id[4:] + `","amount":1999}}}`)
			}},
		{name: "billing", path: "/webhooks/billing", base: base, client: client, out: out, outMu: &outMu,
			sign: billing.SignedHeader,
			body: func(id string) []byte {
				return []byte(`{"type":"invoice.paid","timestamp":"` + time.Now().UTC().Format(time.RFC3339) + `","data":{"invoice":"in_` + id[4:] + `"}}`)
			}},
	}
	var sent []string
	var wg sync.WaitGroup
	for _, s := range senders {
		prefix := map[string]string{"stripe": "evt_", "billing": "msg_"}[s.name]
		for i := range o.events {
			id := newID(prefix)
			body := s.body(id) // fixed per event: every redelivery sends the same bytes
			sent = append(sent, s.name+"/"+id)
			for c := range o.copies {
				wg.Add(1)
				go func() {
					defer wg.Done()
					s.deliverUntilAccepted(ctx, id, body, fmt.Sprintf("copy %d", c+1))
				}()
			}
			if i == 0 { // a copy whose sender gives up mid-processing, then redelivers
				wg.Add(1)
				go func() {
					defer wg.Done()
					cut := &http.Client{Timeout: o.processing / 3}
					a := s.attempt(ctx, cut, id, time.Now(), body)
					s.log(id, "cut copy", 1, a)
					s.deliverUntilAccepted(ctx, id, body, "cut copy, redelivered")
				}()
			}
		}
	}
	wg.Wait()
	// A forged delivery (another secret) and a replayed old one (a captured
	// delivery sent again 10 minutes later) of an event already processed.
	s := senders[0]
	id := strings.TrimPrefix(sent[0], "stripe/")
	forger, _ := idemwebhook.NewStripe("whsec_not_the_endpoint_secret")
	body := s.body(id)
	s.log(id, "forged", 1, s.send(ctx, client, forger.SignedHeader(time.Now(), body), body))
	s.log(id, "replayed 10 min later", 1, s.attempt(ctx, client, id, time.Now().Add(-10*time.Minute), body))
	return sent, ctx.Err()
}

// deliverUntilAccepted is one delivery of id: attempts until a 2xx answer,
// waiting Retry-After (capped at maxWait) between them.
func (s *sender) deliverUntilAccepted(ctx context.Context, id string, body []byte, label string) {
	for n := 1; ctx.Err() == nil; n++ {
		a := s.attempt(ctx, s.client, id, time.Now(), body)
		s.log(id, label, n, a)
		if a.status/100 == 2 {
			return
		}
		wait := maxWait
		if secs, err := strconv.Atoi(a.retryAfter); err == nil && time.Duration(secs)*time.Second < wait {
			wait = time.Duration(secs) * time.Second
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}

// outcome is one attempt's answer, or the error that ended it.
type outcome struct {
	status     int
	what       string // problem type, "replayed", "processed", or the error
	retryAfter string
}

func (s *sender) attempt(ctx context.Context, c *http.Client, id string, t time.Time, body []byte) outcome {
	return s.send(ctx, c, s.sign(id, t, body), body)
}

func (s *sender) send(ctx context.Context, c *http.Client, h http.Header, body []byte) outcome {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.base+s.path, bytes.NewReader(body))
	if err != nil {
		return outcome{what: err.Error()}
	}
	req.Header = h
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return outcome{what: "no answer (" + shortErr(err) + ")"}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	o := outcome{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), what: "processed"}
	switch {
	case resp.Header.Get("Content-Type") == "application/problem+json":
		var p struct{ Type string }
		_ = json.Unmarshal(b, &p)
		o.what = p.Type[strings.LastIndex(p.Type, "#")+1:]
	case resp.Header.Get("Idempotent-Replayed") == "true":
		o.what = "replayed"
	}
	return o
}

func shortErr(err error) string {
	if strings.Contains(err.Error(), "Timeout") || strings.Contains(err.Error(), "deadline") {
		return "sender's timeout"
	}
	return err.Error()
}

func (s *sender) log(id, label string, n int, a outcome) {
	s.outMu.Lock()
	defer s.outMu.Unlock()
	line := fmt.Sprintf("%-8s %s %-22s attempt %d: ", s.name, id, label, n)
	if a.status != 0 {
		line += strconv.Itoa(a.status) + " "
	}
	line += a.what
	if a.retryAfter != "" {
		line += ", Retry-After " + a.retryAfter
	}
	fmt.Fprintln(s.out, line)
}
