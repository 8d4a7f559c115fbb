// This file is the same in every example folder (TestCopiesInStep): the
// fake payment domain every example serves, a provider that takes time,
// declines or fails on Stripe-like test amounts, and counts every execution
// that reached it. It knows nothing about HTTP frameworks or idempotency;
// main.go wires it. Replace it with your own domain.

package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Test amounts, like Stripe's test cards.
const (
	AmountDeclined      = 4000 // the provider declines: 402
	AmountProviderError = 5000 // the provider fails: 502
	AmountPanic         = 6000 // the handler panics: the app's recovery answers 500
)

// Error is a domain failure with the HTTP status the examples answer.
type Error struct {
	Status int
	Title  string
	Detail string
}

func (e *Error) Error() string { return e.Title + ": " + e.Detail }

// Problem returns e as an RFC 9457 application/problem+json body.
func (e *Error) Problem() []byte {
	b, _ := json.Marshal(map[string]any{"type": "about:blank", "title": e.Title, "status": e.Status, "detail": e.Detail})
	return b
}

// ProblemContentType is the media type of Problem bodies.
const ProblemContentType = "application/problem+json"

// Invalid returns a 400 Error.
func Invalid(detail string) *Error {
	return &Error{Status: http.StatusBadRequest, Title: "Invalid request", Detail: detail}
}

// Unauthenticated is answered when X-User-ID is missing.
var Unauthenticated = &Error{Status: http.StatusUnauthorized, Title: "Unauthenticated", Detail: "send X-User-ID (the examples' stand-in for authentication)"}

// ChargeRequest is the body of POST /v1/payments.
type ChargeRequest struct {
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// Payment is a successful charge.
type Payment struct {
	ID       string `json:"id"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	UserID   string `json:"user_id"`
}

// RefundRequest is the body of POST /v1/refunds.
type RefundRequest struct {
	PaymentID string `json:"payment_id"`
	Amount    int64  `json:"amount"`
}

// Refund is a successful refund.
type Refund struct {
	ID        string `json:"id"`
	PaymentID string `json:"payment_id"`
	Amount    int64  `json:"amount"`
	UserID    string `json:"user_id"`
}

// ExportRequest is the body of POST /v1/exports.
type ExportRequest struct {
	Bytes int `json:"bytes"`
}

// MaxExportBytes bounds ExportRequest.Bytes.
const MaxExportBytes = 8 << 20

// Stats is the body of GET /v1/stats.
type Stats struct {
	Executions int64 `json:"executions"`
}

// Ledger records each successful payment before it is answered, e.g. as a
// row in the service's database. Charge fails (a 500, so the key is
// released) when Record does. Record receives the handler's request
// context, where a transactional store's execution lives.
type Ledger interface {
	Record(ctx context.Context, p Payment) error
}

// Service is the fake provider. It is safe for concurrent use.
type Service struct {
	latency    time.Duration
	ledger     Ledger // nil: payments are only kept in memory
	executions atomic.Int64
	mu         sync.RWMutex
	payments   map[string]Payment
}

// newService returns a Service whose provider calls take latency and which
// records payments in ledger (nil: none).
func newService(latency time.Duration, ledger Ledger) *Service {
	return &Service{latency: latency, ledger: ledger, payments: make(map[string]Payment)}
}

// Stats returns the number of executions that reached the provider.
func (s *Service) Stats() Stats { return Stats{Executions: s.executions.Load()} }

// provider stands for the remote call; like a real charge it is not
// abandoned when the client hangs up.
func (s *Service) provider(context.Context) {
	s.executions.Add(1)
	time.Sleep(s.latency)
}

func newID(prefix string) string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

func validCurrency(c string) bool {
	if len(c) != 3 {
		return false
	}
	for i := 0; i < 3; i++ {
		if c[i] < 'a' || c[i] > 'z' {
			return false
		}
	}
	return true
}

// Charge charges amount for user. It returns a 400 Error for invalid input,
// 402 for AmountDeclined, 502 for AmountProviderError, and panics for AmountPanic.
func (s *Service) Charge(ctx context.Context, user string, req ChargeRequest) (Payment, error) {
	if req.Amount <= 0 {
		return Payment{}, Invalid("amount must be a positive integer in minor units")
	}
	if !validCurrency(req.Currency) {
		return Payment{}, Invalid("currency must be 3 lowercase letters, e.g. eur")
	}
	s.provider(ctx)
	switch req.Amount {
	case AmountDeclined:
		return Payment{}, &Error{Status: http.StatusPaymentRequired, Title: "Card declined", Detail: "the provider declined the charge"}
	case AmountProviderError:
		return Payment{}, &Error{Status: http.StatusBadGateway, Title: "Provider error", Detail: "the payment provider failed; retry with the same Idempotency-Key"}
	case AmountPanic:
		panic(fmt.Sprintf("payments: provider crashed on amount %d", req.Amount))
	}
	p := Payment{ID: newID("pay_"), Amount: req.Amount, Currency: req.Currency, UserID: user}
	if s.ledger != nil {
		if err := s.ledger.Record(ctx, p); err != nil {
			return Payment{}, fmt.Errorf("payments: record %s: %w", p.ID, err)
		}
	}
	s.mu.Lock()
	s.payments[p.ID] = p
	s.mu.Unlock()
	return p, nil
}

// Payment returns a stored payment.
func (s *Service) Payment(id string) (Payment, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	p, ok := s.payments[id]
	return p, ok
}

// Refund refunds part of a payment of user's; 400 for invalid input, 404 for
// an unknown payment.
func (s *Service) Refund(ctx context.Context, user string, req RefundRequest) (Refund, error) {
	p, ok := s.Payment(req.PaymentID)
	if !ok || p.UserID != user {
		return Refund{}, &Error{Status: http.StatusNotFound, Title: "Payment not found", Detail: "no payment " + req.PaymentID}
	}
	if req.Amount <= 0 || req.Amount > p.Amount {
		return Refund{}, Invalid("amount must be between 1 and the payment's amount")
	}
	s.provider(ctx)
	return Refund{ID: newID("re_"), PaymentID: p.ID, Amount: req.Amount, UserID: user}, nil
}

// Export returns 16 random bytes followed by n bytes where byte i = i mod 256.
func (s *Service) Export(ctx context.Context, req ExportRequest) ([]byte, error) {
	if req.Bytes < 0 || req.Bytes > MaxExportBytes {
		return nil, Invalid(fmt.Sprintf("bytes must be between 0 and %d", MaxExportBytes))
	}
	s.provider(ctx)
	b := make([]byte, 16+req.Bytes)
	_, _ = rand.Read(b[:16])
	for i := 0; i < req.Bytes; i++ {
		b[16+i] = byte(i)
	}
	return b, nil
}
