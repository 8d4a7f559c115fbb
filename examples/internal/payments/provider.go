package payments

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	idem "github.com/idemkit/idem/core"
)

// PausePoints are the values of -pause-at: where a payment's handler can be
// held, in the order it reaches them, when it charges through -provider-url.
var PausePoints = []string{
	"before-charge",       // before the charge step
	"charge-before-call",  // in the charge step, before POST /v1/charges
	"charge-after-call",   // in the charge step, after the provider answered
	"receipt-before-call", // in the receipt step, before POST /v1/emails
	"receipt-after-call",  // in the receipt step, after the mail was sent
	"after-steps",         // after the receipt step, before the ledger row
	"before-completion",   // at the end of the handler, after the ledger row
}

// cardProvider is the client of examples/cardprovider, the card provider
// Service.Charge calls with -provider-url.
type cardProvider struct {
	url    string
	client *http.Client
	// noSteps makes the calls without idem.Step and without idempotency
	// keys (-no-steps: the control that shows what steps prevent).
	noSteps bool
	// pauseAt is -pause-at's points: the n-th payment this process
	// handles is held at pauseAt[n mod len].
	pauseAt []string
	payment atomic.Int64   // payments handled, for pauseAt
	resume  chan os.Signal // SIGUSR1 ends a pause
	crashAt string         // -crash-at
}

// pauseKey is the context key of a payment's pause point and user.
type pauseKey struct{}

type pausePoint struct{ point, user string }

// newCardProvider returns the client f's -provider-url names, nil without one.
func newCardProvider(f Config) (*cardProvider, error) {
	if f.ProviderURL == "" {
		if f.NoSteps || f.PauseAt != "" || f.CrashAt != "" {
			return nil, errors.New("-no-steps, -pause-at and -crash-at need -provider-url")
		}
		return nil, nil
	}
	if !strings.HasPrefix(f.ProviderURL, "http://") && !strings.HasPrefix(f.ProviderURL, "https://") {
		return nil, fmt.Errorf("-provider-url %q: want an http:// or https:// URL", f.ProviderURL)
	}
	p := &cardProvider{url: strings.TrimSuffix(f.ProviderURL, "/"), client: &http.Client{Timeout: 10 * time.Second},
		noSteps: f.NoSteps, crashAt: f.CrashAt}
	if f.PauseAt != "" {
		p.pauseAt = strings.Split(f.PauseAt, ",")
	}
	for _, point := range append(slices.Clip(p.pauseAt), f.CrashAt) {
		if point != "" && !slices.Contains(PausePoints, point) {
			return nil, fmt.Errorf("-pause-at or -crash-at %q: want one of %s", point, strings.Join(PausePoints, ", "))
		}
	}
	if len(p.pauseAt) > 0 {
		p.resume = make(chan os.Signal, 1)
		signal.Notify(p.resume, syscall.SIGUSR1)
	}
	return p, nil
}

// assign returns ctx carrying the point of -pause-at the payment of user
// is held at: the n-th payment of the process gets the n-th point,
// cyclically.
func (p *cardProvider) assign(ctx context.Context, user string) context.Context {
	if len(p.pauseAt) == 0 {
		return ctx
	}
	n := p.payment.Add(1) - 1
	return context.WithValue(ctx, pauseKey{}, pausePoint{p.pauseAt[n%int64(len(p.pauseAt))], user})
}

// pause kills the process at -crash-at's point, and holds the handler at
// the point assign gave its payment: it prints "paused at POINT USER" and
// waits for SIGUSR1.
func (p *cardProvider) pause(ctx context.Context, point string) {
	if point == p.crashAt {
		fmt.Println("crashing at", point)
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
	if pp, ok := ctx.Value(pauseKey{}).(pausePoint); ok && pp.point == point {
		fmt.Println("paused at", point, pp.user)
		<-p.resume
	}
}

// step runs fn as idem.Step(ctx, name, fn, opts...), or as it is with
// -no-steps.
func step[T any](ctx context.Context, p *cardProvider, name string, fn func(ctx context.Context) (T, error), opts ...idem.StepOption) (T, error) {
	if p.noSteps {
		return fn(ctx)
	}
	return idem.Step(ctx, name, fn, opts...)
}

// providerCharge is the provider's answer to POST /v1/charges.
type providerCharge struct {
	ID       string `json:"id"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// Declined is the answer to a charge the provider declined.
var Declined = &Error{Status: http.StatusPaymentRequired, Title: "Card declined", Detail: "the provider declined the charge"}

// chargeCard charges req through the provider, sends the receipt to user,
// and returns the payment to record: the charge is a Repeatable step whose
// derived key is the provider's Idempotency-Key (a takeover that finds it
// started charges again under the same key, and the provider answers the
// first charge); the receipt is a step that is not repeatable, since the
// mail endpoint takes no key (a takeover that finds it started ends the
// key uncertain instead of mailing twice). A decline is a permanent
// failure: journaled, and answered 402 on every retry.
func (p *cardProvider) chargeCard(ctx context.Context, user string, req ChargeRequest) (Payment, error) {
	p.pause(ctx, "before-charge")
	ch, err := step(ctx, p, "charge", func(ctx context.Context) (providerCharge, error) {
		key, _ := idem.DerivedKey(ctx) // "" with -no-steps: every call charges
		p.pause(ctx, "charge-before-call")
		var ch providerCharge
		status, err := p.post(ctx, "/v1/charges", key, req, &ch)
		p.pause(ctx, "charge-after-call")
		switch {
		case err != nil:
			return ch, err
		case status == http.StatusPaymentRequired:
			return ch, idem.Permanent(Declined)
		case status == http.StatusConflict || status >= 500: // in progress under the key, or failing: retry later
			return ch, &Error{Status: http.StatusBadGateway, Title: "Provider error", Detail: fmt.Sprintf("the card provider answered %d; retry with the same Idempotency-Key", status)}
		case status != http.StatusOK:
			return ch, idem.Permanent(&Error{Status: http.StatusBadGateway, Title: "Provider refused the charge", Detail: fmt.Sprintf("the card provider answered %d", status)})
		}
		return ch, nil
	}, idem.Repeatable())
	var stored *idem.StoredError
	if errors.As(err, &stored) { // a journaled decline, replayed
		if stored.Message == Declined.Error() {
			return Payment{}, Declined
		}
		return Payment{}, &Error{Status: http.StatusBadGateway, Title: "Provider refused the charge", Detail: stored.Message}
	}
	if err != nil {
		return Payment{}, err
	}
	receipt := map[string]string{"to": user, "subject": "Receipt for " + ch.ID}
	_, err = step(ctx, p, "receipt", func(ctx context.Context) (string, error) {
		p.pause(ctx, "receipt-before-call")
		var sent struct {
			ID string `json:"id"`
		}
		status, err := p.post(ctx, "/v1/emails", "", receipt, &sent)
		p.pause(ctx, "receipt-after-call")
		if err == nil && status != http.StatusOK {
			err = fmt.Errorf("payments: POST /v1/emails: %d", status)
		}
		return sent.ID, err
	})
	if err != nil {
		return Payment{}, err
	}
	p.pause(ctx, "after-steps")
	return Payment{ID: newID("pay_"), ChargeID: ch.ID, Amount: req.Amount, Currency: req.Currency, UserID: user}, nil
}

// post sends body as JSON to the provider's path, with key as its
// Idempotency-Key unless empty, and decodes a 2xx answer into out. Like
// the charge itself, the call is not abandoned when the client hangs up.
func (p *cardProvider) post(ctx context.Context, path, key string, body, out any) (int, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(context.WithoutCancel(ctx), http.MethodPost, p.url+path, bytes.NewReader(b))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("payments: POST %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return 0, fmt.Errorf("payments: POST %s: decoding the answer: %w", path, err)
	}
	return resp.StatusCode, nil
}
