package payments

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"
)

// Request is what a framework's wiring hands a route: the principal its
// authentication set (protected routes), the {id} or {sku} path parameter,
// and the body.
type Request struct {
	User  string
	Param string
	Body  []byte
}

// Response is a route's answer, which the wiring writes as it is.
type Response struct {
	Status      int
	ContentType string
	Location    string // set on 201 Created of a resource that has a URL
	Body        []byte
}

// Route is one endpoint of the HTTP contract, the same on every framework.
type Route struct {
	Method string
	// Path is a net/http pattern path: "/v1/payments/{id}"; ColonPath
	// gives the ":id" form of Gin, Echo and Fiber.
	Path string
	// Protected routes sit behind authentication (X-User-ID) and idem.
	Protected bool
	Handle    func(ctx context.Context, r Request) Response
}

// ColonPath returns path with "{name}" segments written ":name".
func ColonPath(path string) string {
	return strings.NewReplacer("{id}", ":id", "{sku}", ":sku").Replace(path)
}

// Param returns the name of path's parameter ("" when it has none).
func (r Route) Param() string {
	_, after, ok := strings.Cut(r.Path, "{")
	if !ok {
		return ""
	}
	name, _, _ := strings.Cut(after, "}")
	return name
}

// Routes returns the HTTP contract served on svc: the handlers' logic,
// shared by every framework; it knows nothing about idem. The mutating
// routes are protected; GET /metrics is the wiring's.
func Routes(svc *Service) []Route {
	return []Route{
		{"POST", "/v1/payments", true, func(ctx context.Context, r Request) Response {
			p, err := decodeAnd(r, func(req ChargeRequest) (Payment, error) { return svc.Charge(ctx, r.User, req) })
			return created(p, err, "/v1/payments/"+p.ID)
		}},
		{"POST", "/v1/refunds", true, func(ctx context.Context, r Request) Response {
			rf, err := decodeAnd(r, func(req RefundRequest) (Refund, error) { return svc.Refund(ctx, r.User, req) })
			return created(rf, err, "")
		}},
		{"POST", "/v1/exports", true, func(ctx context.Context, r Request) Response {
			b, err := decodeAnd(r, func(req ExportRequest) ([]byte, error) { return svc.Export(ctx, req) })
			if err != nil {
				return ProblemResponse(err)
			}
			return Response{Status: http.StatusOK, ContentType: "application/octet-stream", Body: b}
		}},
		{"POST", "/v1/orders", true, func(ctx context.Context, r Request) Response {
			o, err := decodeAnd(r, func(req OrderRequest) (Order, error) { return svc.PlaceOrder(ctx, r.User, req) })
			return created(o, err, "")
		}},
		{"POST", "/v1/stock/decrements", true, func(ctx context.Context, r Request) Response {
			st, err := decodeAnd(r, func(req StockRequest) (Stock, error) { return svc.DecrementStock(ctx, req) })
			return answer(http.StatusOK, st, err)
		}},
		{"POST", "/v1/emails", true, func(ctx context.Context, r Request) Response {
			e, err := decodeAnd(r, func(req EmailRequest) (Email, error) { return svc.SendEmail(ctx, req) })
			return answer(http.StatusAccepted, e, err)
		}},
		{"POST", "/v1/signups", true, func(ctx context.Context, r Request) Response {
			a, err := decodeAnd(r, func(req SignupRequest) (Account, error) { return svc.SignUp(ctx, req) })
			return created(a, err, "")
		}},
		{"GET", "/v1/payments/{id}", false, func(_ context.Context, r Request) Response {
			p, ok := svc.Payment(r.Param)
			if !ok {
				return ProblemResponse(&Error{Status: http.StatusNotFound, Title: "Payment not found", Detail: "no payment " + r.Param})
			}
			return answer(http.StatusOK, p, nil)
		}},
		{"GET", "/v1/stock/{sku}", false, func(_ context.Context, r Request) Response {
			return answer(http.StatusOK, svc.StockOf(r.Param), nil)
		}},
		{"GET", "/v1/stats", false, func(context.Context, Request) Response {
			return answer(http.StatusOK, svc.Stats(), nil)
		}},
	}
}

// decodeAnd decodes r's JSON body into a Req and calls op with it; a body
// that is not JSON is a 400 Error.
func decodeAnd[Req, Res any](r Request, op func(Req) (Res, error)) (Res, error) {
	var req Req
	if err := json.Unmarshal(r.Body, &req); err != nil {
		var zero Res
		return zero, Invalid("body must be JSON: " + err.Error())
	}
	return op(req)
}

func created(v any, err error, location string) Response {
	res := answer(http.StatusCreated, v, err)
	if err == nil {
		res.Location = location
	}
	return res
}

func answer(status int, v any, err error) Response {
	if err != nil {
		return ProblemResponse(err)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return ProblemResponse(err)
	}
	return Response{Status: status, ContentType: "application/json", Body: append(b, '\n')}
}

// ProblemResponse answers err as an RFC 9457 problem: an *Error with its
// status, anything else a 500 (a handler failure: idem releases the key).
func ProblemResponse(err error) Response {
	var pe *Error
	if !errors.As(err, &pe) {
		slog.Error("handler failed", "err", err)
		pe = InternalError
	}
	return Response{Status: pe.Status, ContentType: ProblemContentType, Body: pe.Problem()}
}

// InternalError is the problem of a failed handler or a panic; idem has
// released the key.
var InternalError = &Error{Status: http.StatusInternalServerError, Title: "Internal error", Detail: "the server failed; retry with the same Idempotency-Key"}
