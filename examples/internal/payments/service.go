package payments

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
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
	ID string `json:"id"`
	// ChargeID is the card provider's charge, with -provider-url.
	ChargeID string `json:"charge_id,omitempty"`
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

// OrderRequest is the body of POST /v1/orders.
type OrderRequest struct {
	SKU      string `json:"sku"`
	Quantity int64  `json:"quantity"`
}

// Order is a placed order.
type Order struct {
	ID       string `json:"id"`
	SKU      string `json:"sku"`
	Quantity int64  `json:"quantity"`
	UserID   string `json:"user_id"`
}

// StockRequest is the body of POST /v1/stock/decrements: take Quantity of
// SKU out of the stock.
type StockRequest struct {
	SKU      string `json:"sku"`
	Quantity int64  `json:"quantity"`
}

// Stock is what is left of a SKU (GET /v1/stock/{sku}, and the answer of a
// decrement).
type Stock struct {
	SKU       string `json:"sku"`
	Remaining int64  `json:"remaining"`
}

// InitialStock is every SKU's stock before its first decrement.
const InitialStock = 100

// EmailRequest is the body of POST /v1/emails.
type EmailRequest struct {
	To      string `json:"to"`
	Subject string `json:"subject"`
}

// Email is a sent email.
type Email struct {
	ID      string `json:"id"`
	To      string `json:"to"`
	Subject string `json:"subject"`
}

// SignupRequest is the body of POST /v1/signups.
type SignupRequest struct {
	Email string `json:"email"`
}

// Account is a signed-up user: a row of the signups table, whose email
// column is unique.
type Account struct {
	ID    string `json:"id"`
	Email string `json:"email"`
}

// ErrEmailTaken is what a Ledger's SignUp returns when the signups table's
// unique constraint on email refuses the row.
var ErrEmailTaken = &Error{Status: http.StatusConflict, Title: "Email already registered", Detail: "the signups table's unique constraint on email refused the row"}

// Stats is the body of GET /v1/stats: Executions counts every operation
// that reached the provider (payments, refunds, exports, orders, stock
// decrements, emails and sign-ups); the others count each kind's effects.
type Stats struct {
	Executions      int64 `json:"executions"`
	Orders          int64 `json:"orders"`
	StockDecrements int64 `json:"stock_decrements"`
	EmailsSent      int64 `json:"emails_sent"`
	Signups         int64 `json:"signups"`
}

// Ledger writes what the service must keep in its database before it
// answers: payments and accounts. The operation fails when it does (a 500,
// so the key is released), but for ErrEmailTaken (a 409). It receives the
// handler's request context, where a transactional store's execution lives.
type Ledger interface {
	Record(ctx context.Context, p Payment) error
	SignUp(ctx context.Context, a Account) error
}

// Service is the fake provider. It is safe for concurrent use.
type Service struct {
	latency    time.Duration
	ledger     Ledger        // nil: everything is kept in memory
	card       *cardProvider // nil: the provider is simulated in process
	executions atomic.Int64
	orders     atomic.Int64
	decrements atomic.Int64
	emails     atomic.Int64
	signups    atomic.Int64
	mu         sync.RWMutex
	payments   map[string]Payment
	stock      map[string]int64   // SKU → remaining
	accounts   map[string]Account // email → account: the in-memory signups table
}

// NewService returns a Service whose provider calls take latency and which
// records payments and accounts in ledger (nil: in memory only).
func NewService(latency time.Duration, ledger Ledger) *Service {
	return &Service{latency: latency, ledger: ledger, payments: make(map[string]Payment),
		stock: make(map[string]int64), accounts: make(map[string]Account)}
}

// Stats returns the number of executions that reached the provider, and of
// each operation's effects.
func (s *Service) Stats() Stats {
	return Stats{Executions: s.executions.Load(), Orders: s.orders.Load(), StockDecrements: s.decrements.Load(),
		EmailsSent: s.emails.Load(), Signups: s.signups.Load()}
}

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

// Charge charges amount for user and records the payment in the ledger. It
// returns a 400 Error for invalid input and 402 for AmountDeclined. The
// provider is simulated in process (502 for AmountProviderError, a panic
// for AmountPanic) unless -provider-url names examples/cardprovider: then
// the charge and the receipt are durable steps (cardProvider.chargeCard)
// and the ledger row is written after them, in the execution's
// transaction where the store is SQL.
func (s *Service) Charge(ctx context.Context, user string, req ChargeRequest) (Payment, error) {
	if req.Amount <= 0 {
		return Payment{}, Invalid("amount must be a positive integer in minor units")
	}
	if !validCurrency(req.Currency) {
		return Payment{}, Invalid("currency must be 3 lowercase letters, e.g. eur")
	}
	var p Payment
	if s.card != nil {
		ctx = s.card.assign(ctx, user)
		var err error
		if p, err = s.card.chargeCard(ctx, user, req); err != nil {
			return Payment{}, err
		}
	} else {
		s.provider(ctx)
		switch req.Amount {
		case AmountDeclined:
			return Payment{}, Declined
		case AmountProviderError:
			return Payment{}, &Error{Status: http.StatusBadGateway, Title: "Provider error", Detail: "the payment provider failed; retry with the same Idempotency-Key"}
		case AmountPanic:
			panic(fmt.Sprintf("payments: provider crashed on amount %d", req.Amount))
		}
		p = Payment{ID: newID("pay_"), Amount: req.Amount, Currency: req.Currency, UserID: user}
	}
	if s.ledger != nil {
		if err := s.ledger.Record(ctx, p); err != nil {
			return Payment{}, fmt.Errorf("payments: record %s: %w", p.ID, err)
		}
	}
	if s.card != nil {
		s.card.pause(ctx, "before-completion")
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

// PlaceOrder places an order of req.Quantity of req.SKU for user; 400 for
// invalid input.
func (s *Service) PlaceOrder(ctx context.Context, user string, req OrderRequest) (Order, error) {
	if req.SKU == "" || req.Quantity <= 0 {
		return Order{}, Invalid("sku must be set and quantity positive")
	}
	s.provider(ctx)
	s.orders.Add(1)
	return Order{ID: newID("ord_"), SKU: req.SKU, Quantity: req.Quantity, UserID: user}, nil
}

// DecrementStock takes req.Quantity of req.SKU out of the stock (each SKU
// starts at InitialStock) and returns what is left: 400 for invalid input,
// 409 when there is not enough left.
func (s *Service) DecrementStock(ctx context.Context, req StockRequest) (Stock, error) {
	if req.SKU == "" || req.Quantity <= 0 {
		return Stock{}, Invalid("sku must be set and quantity positive")
	}
	s.provider(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	left, ok := s.stock[req.SKU]
	if !ok {
		left = InitialStock
	}
	if left < req.Quantity {
		return Stock{}, &Error{Status: http.StatusConflict, Title: "Out of stock", Detail: fmt.Sprintf("%d of %s left", left, req.SKU)}
	}
	s.stock[req.SKU] = left - req.Quantity
	s.decrements.Add(1)
	return Stock{SKU: req.SKU, Remaining: left - req.Quantity}, nil
}

// StockOf returns what is left of sku.
func (s *Service) StockOf(sku string) Stock {
	s.mu.RLock()
	defer s.mu.RUnlock()
	left, ok := s.stock[sku]
	if !ok {
		left = InitialStock
	}
	return Stock{SKU: sku, Remaining: left}
}

// SendEmail sends an email (the provider call stands for the mail API);
// 400 for invalid input.
func (s *Service) SendEmail(ctx context.Context, req EmailRequest) (Email, error) {
	if !strings.Contains(req.To, "@") {
		return Email{}, Invalid("to must be an email address")
	}
	s.provider(ctx)
	s.emails.Add(1)
	return Email{ID: newID("em_"), To: req.To, Subject: req.Subject}, nil
}

// SignUp creates the account of req.Email: a row of the signups table
// (the ledger's, else in memory) whose unique constraint on email makes a
// second sign-up of the same email fail with ErrEmailTaken; 400 for invalid
// input.
func (s *Service) SignUp(ctx context.Context, req SignupRequest) (Account, error) {
	if !strings.Contains(req.Email, "@") {
		return Account{}, Invalid("email must be an email address")
	}
	s.provider(ctx)
	a := Account{ID: newID("usr_"), Email: req.Email}
	if s.ledger != nil {
		if err := s.ledger.SignUp(ctx, a); err != nil {
			if errors.Is(err, ErrEmailTaken) {
				return Account{}, ErrEmailTaken
			}
			return Account{}, fmt.Errorf("payments: sign up %s: %w", a.ID, err)
		}
	} else {
		s.mu.Lock()
		_, taken := s.accounts[req.Email]
		if !taken {
			s.accounts[req.Email] = a
		}
		s.mu.Unlock()
		if taken {
			return Account{}, ErrEmailTaken
		}
	}
	s.signups.Add(1)
	return a, nil
}
