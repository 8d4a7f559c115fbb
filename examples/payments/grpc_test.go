package main

import (
	"context"
	"crypto/rand"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem/adapters/idemgrpc"
	"github.com/idemkit/idem/adapters/idemhttp"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/examples/grpc/gen/paymentsv1"
	"github.com/idemkit/idem/examples/grpc/gen/paymentsv1/paymentsv1connect"
	"github.com/idemkit/idem/examples/internal/payments"
	"github.com/idemkit/idem/stores/memstore"
)

// rig is the example's two servers over one engine, and clients.
type rig struct {
	engine  *idem.Engine
	svc     *payments.Service
	grpc    paymentsv1.PaymentsClient
	connect paymentsv1connect.PaymentsClient
	url     string
}

func newRig(t *testing.T, store idem.Store) *rig {
	t.Helper()
	engine, err := idem.New(store)
	if err != nil {
		t.Fatal(err)
	}
	svc := payments.NewService(0, nil)
	grpcSrv, connectHandler := newServers(engine, svc)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = grpcSrv.Serve(ln) }()
	cc, err := grpc.NewClient("passthrough:///"+ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewUnstartedServer(connectHandler)
	hs.EnableHTTP2 = true
	hs.StartTLS()
	t.Cleanup(func() {
		_ = cc.Close()
		grpcSrv.Stop()
		<-done
		hs.Close()
		_ = engine.Close(context.Background())
	})
	return &rig{engine: engine, svc: svc, grpc: paymentsv1.NewPaymentsClient(cc),
		connect: paymentsv1connect.NewPaymentsClient(hs.Client(), hs.URL), url: hs.URL}
}

func ctxFor(t *testing.T, user, key string) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return metadata.AppendToOutgoingContext(ctx, "x-user-id", user, "idempotency-key", key)
}

func TestPaymentsOverGRPC(t *testing.T) {
	r := newRig(t, memstore.New())
	key := rand.Text()
	var h1, h2 metadata.MD
	p1, err := r.grpc.CreatePayment(ctxFor(t, "alice", key), &paymentsv1.CreatePaymentRequest{Amount: 1200, Currency: "eur"}, grpc.Header(&h1))
	if err != nil {
		t.Fatal(err)
	}
	p2, err := r.grpc.CreatePayment(ctxFor(t, "alice", key), &paymentsv1.CreatePaymentRequest{Amount: 1200, Currency: "eur"}, grpc.Header(&h2))
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(p1, p2) || h2.Get(idemgrpc.ReplayedMetadata)[0] != "true" || h1.Get("location")[0] != h2.Get("location")[0] {
		t.Fatalf("replay %v %v, header %v", p1, p2, h2)
	}
	// 4000: declined, stored; 5000: provider unavailable, released; 6000: panic, released.
	for _, c := range []struct {
		amount     int64
		code       codes.Code
		executions int64
	}{{payments.AmountDeclined, codes.FailedPrecondition, 1}, {payments.AmountProviderError, codes.Unavailable, 2}, {payments.AmountPanic, codes.Internal, 2}} {
		before := r.svc.Stats().Executions
		key := rand.Text()
		for range 2 {
			_, err := r.grpc.CreatePayment(ctxFor(t, "alice", key), &paymentsv1.CreatePaymentRequest{Amount: c.amount, Currency: "eur"})
			if status.Code(err) != c.code {
				t.Fatalf("amount %d: %v, want %v", c.amount, err, c.code)
			}
		}
		if n := r.svc.Stats().Executions - before; n != c.executions {
			t.Fatalf("amount %d: %d executions, want %d", c.amount, n, c.executions)
		}
	}
	if n := r.svc.Stats().Executions; n != 6 {
		t.Fatalf("%d executions in all, want 6", n)
	}
}

// TestOneKeyAcrossGRPCAndConnect: the same procedure through grpc-go and
// through connect-go is one operation: executed once, replayed through
// the other door.
func TestOneKeyAcrossGRPCAndConnect(t *testing.T) {
	r := newRig(t, memstore.New())
	key := rand.Text()
	p1, err := r.grpc.CreatePayment(ctxFor(t, "alice", key), &paymentsv1.CreatePaymentRequest{Amount: 1200, Currency: "eur"})
	if err != nil {
		t.Fatal(err)
	}
	req := connect.NewRequest(&paymentsv1.CreatePaymentRequest{Amount: 1200, Currency: "eur"})
	req.Header().Set("X-User-Id", "alice")
	req.Header().Set("Idempotency-Key", key)
	res, err := r.connect.CreatePayment(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(p1, res.Msg) || res.Header().Get(idem.ReplayedHeader) != "true" {
		t.Fatalf("connect replay %v, want %v", res.Msg, p1)
	}
	if n := r.svc.Stats().Executions; n != 1 {
		t.Fatalf("%d executions, want 1", n)
	}
}

// TestHTTPAndGRPCAreDifferentOperations: a payment created over HTTP (POST
// /v1/payments through idemhttp) with key K and sent again over gRPC with K
// is a second record and a second execution, by design: the route
// (/v1/payments vs /payments.v1.Payments/CreatePayment) is part of the
// key's scope, and the two doors encode the request differently (JSON body
// vs protobuf message), so they are different operations. Each door
// replays its own record.
func TestHTTPAndGRPCAreDifferentOperations(t *testing.T) {
	store := memstore.New()
	r := newRig(t, store)
	httpSrv := httptest.NewServer(idemhttp.New(r.engine, idemhttp.WithScope(func(req *http.Request) string {
		return req.Header.Get("X-User-ID")
	}))(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		p, err := r.svc.Charge(req.Context(), req.Header.Get("X-User-ID"), payments.ChargeRequest{Amount: 1200, Currency: "eur"})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"` + p.ID + `"}`))
	})))
	t.Cleanup(httpSrv.Close)
	key := rand.Text()
	post := func() *http.Response {
		req, _ := http.NewRequest(http.MethodPost, httpSrv.URL+"/v1/payments", strings.NewReader(`{"amount":1200,"currency":"eur"}`))
		req.Header.Set("X-User-ID", "alice")
		req.Header.Set("Idempotency-Key", key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = res.Body.Close()
		return res
	}
	if res := post(); res.StatusCode != http.StatusCreated {
		t.Fatalf("HTTP: %d", res.StatusCode)
	}
	for range 2 {
		if _, err := r.grpc.CreatePayment(ctxFor(t, "alice", key), &paymentsv1.CreatePaymentRequest{Amount: 1200, Currency: "eur"}); err != nil {
			t.Fatal(err)
		}
	}
	if res := post(); res.Header.Get(idem.ReplayedHeader) != "true" {
		t.Fatal("HTTP retry not replayed")
	}
	if n := r.svc.Stats().Executions; n != 2 {
		t.Fatalf("%d executions, want 2 (one per door)", n)
	}
}
