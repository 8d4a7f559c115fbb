// Command cardprovider is a fake card payment provider for idem's examples
// and tests, run as its own process so that it outlives the services that
// call it: it behaves like Stripe's API for the two calls a payments
// handler makes outside its SQL transaction.
//
//   - POST /v1/charges (JSON: amount, currency) charges a card. With
//     an Idempotency-Key header, the same key and the same parameters get
//     the first charge back (header Idempotent-Replayed: true) without
//     charging again; the same key with other parameters gets 400
//     idempotency_error (Stripe: "Keys for idempotent requests can only be
//     used with the same parameters they were first used with"); a request
//     still running under the key gets 409. Without a key every request
//     charges. Amount 4000 is declined (402 card_declined, like Stripe's
//     test card 4000000000000002): nothing is charged, and the decline is
//     the key's answer, replayed as a charge would be.
//   - POST /v1/emails sends a receipt. It takes no idempotency key, as most
//     mail relays: every call sends one.
//   - GET /v1/stats answers {"charges": n, "emails": n, "keyed_calls": n,
//     "conflicts": n}: the real effects, and the charge requests with an
//     Idempotency-Key received and those of them answered 409 (another
//     request under the key still running), for tests that count them.
//
// It prints "cardprovider listening on http://ADDR" once it serves.
//
//	go run ./examples/cardprovider -addr 127.0.0.1:8090
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address")
	latency := flag.Duration("latency", 0, "how long each charge takes (a slow provider)")
	flag.Parse()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Handler: newProvider(*latency), ReadHeaderTimeout: 5 * time.Second}
	fmt.Printf("cardprovider listening on http://%s\n", ln.Addr())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shut)
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}

// charge is a charge as the provider answers it.
type charge struct {
	ID       string `json:"id"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// declinedAmount is the amount the provider declines.
const declinedAmount = 4000

// declined is the body of a 402.
var declined = map[string]string{"error": "card_declined", "message": "Your card was declined."}

// keyed is what the provider remembers of an idempotency key.
type keyed struct {
	params string
	done   chan struct{} // closed once result is set
	status int           // 200, or 402 for a decline
	result any
}

type provider struct {
	latency time.Duration
	mu      sync.Mutex
	keys    map[string]*keyed
	charges int
	emails  int
	calls   int // charge requests with an Idempotency-Key
	// conflicts counts keyed charge requests that came while another
	// request under the key was running (answered 409).
	conflicts int
}

func newProvider(latency time.Duration) http.Handler {
	p := &provider{latency: latency, keys: map[string]*keyed{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/charges", p.charge)
	mux.HandleFunc("POST /v1/emails", p.email)
	mux.HandleFunc("GET /v1/stats", p.stats)
	return mux
}

func (p *provider) charge(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Amount   int64  `json:"amount"`
		Currency string `json:"currency"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16)).Decode(&in); err != nil || in.Amount <= 0 || in.Currency == "" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid_request", "message": "amount > 0 and currency are required"})
		return
	}
	params := strconv.FormatInt(in.Amount, 10) + " " + in.Currency
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		status, v := p.answer(in.Amount, in.Currency)
		writeJSON(w, status, v)
		return
	}
	p.mu.Lock()
	p.calls++
	k, seen := p.keys[key]
	if !seen {
		k = &keyed{params: params, done: make(chan struct{})}
		p.keys[key] = k
	}
	p.mu.Unlock()
	switch {
	case seen && k.params != params:
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "idempotency_error",
			"message": "Keys for idempotent requests can only be used with the same parameters they were first used with."})
		return
	case seen:
		select {
		case <-k.done:
			w.Header().Set("Idempotent-Replayed", "true")
			writeJSON(w, k.status, k.result)
		default:
			p.mu.Lock()
			p.conflicts++
			p.mu.Unlock()
			writeJSON(w, http.StatusConflict, map[string]string{"error": "idempotency_error", "message": "A request with this key is in progress."})
		}
		return
	}
	k.status, k.result = p.answer(in.Amount, in.Currency)
	close(k.done)
	writeJSON(w, k.status, k.result)
}

// answer declines declinedAmount (402) and charges any other amount (200).
func (p *provider) answer(amount int64, currency string) (int, any) {
	if amount == declinedAmount {
		return http.StatusPaymentRequired, declined
	}
	return http.StatusOK, p.newCharge(amount, currency)
}

// newCharge charges the card: the real effect, counted.
func (p *provider) newCharge(amount int64, currency string) charge {
	if p.latency > 0 {
		time.Sleep(p.latency)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.charges++
	return charge{ID: fmt.Sprintf("ch_%06d", p.charges), Amount: amount, Currency: currency}
}

func (p *provider) email(w http.ResponseWriter, r *http.Request) {
	var in struct {
		To      string `json:"to"`
		Subject string `json:"subject"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16)).Decode(&in); err != nil || in.To == "" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid_request", "message": "to is required"})
		return
	}
	p.mu.Lock()
	p.emails++
	n := p.emails
	p.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]string{"id": fmt.Sprintf("em_%06d", n)})
}

func (p *provider) stats(w http.ResponseWriter, _ *http.Request) {
	p.mu.Lock()
	defer p.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]int{"charges": p.charges, "emails": p.emails, "keyed_calls": p.calls, "conflicts": p.conflicts})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
