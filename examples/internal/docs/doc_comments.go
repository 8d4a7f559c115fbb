package docs

import (
	"context"
	"database/sql"
	"io"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"github.com/gin-gonic/gin"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"

	"github.com/idemkit/idem/adapters/idemconnect"
	"github.com/idemkit/idem/adapters/idemgin"
	"github.com/idemkit/idem/adapters/idemgrpc"
	"github.com/idemkit/idem/adapters/idemhttp"
	"github.com/idemkit/idem/adapters/idemnats"
	"github.com/idemkit/idem/client/idemclient"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/examples/grpc/gen/paymentsv1/paymentsv1connect"
	"github.com/idemkit/idem/observability/idemotel"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/stores/pgstore"
)

func idemconnectDoc() {
	mux := http.NewServeMux()
	var svc paymentsv1connect.PaymentsHandler
	var userID func(context.Context) string
	var auth func(http.Handler) http.Handler
	// doc: adapters/idemconnect/doc.go
	e, err := idem.New(store)
	path, handler := paymentsv1connect.NewPaymentsHandler(svc, connect.WithInterceptors(
		idemconnect.NewInterceptor(e, idemconnect.WithScope(userID)),
	))
	mux.Handle(path, auth(handler)) // authentication outside: it stores the principal

	client := paymentsv1connect.NewPaymentsClient(http.DefaultClient, url,
		connect.WithInterceptors(idemconnect.NewClientInterceptor()))
	// doc end
	_, _ = err, client
}

func idemginDoc() {
	r := gin.New()
	var auth, createPayment gin.HandlerFunc
	// doc: adapters/idemgin/idemgin.go
	e, err := idem.New(store)
	r.Use(auth) // sets "user_id"
	r.POST("/v1/payments", idemgin.New(e, idemgin.WithScope(func(c *gin.Context) string {
		return c.GetString("user_id")
	})), createPayment)
	// doc end
	_ = err
}

func idemgrpcDoc() {
	var recovery, auth grpc.UnaryServerInterceptor
	var userID func(context.Context) string
	var addr string
	// doc: adapters/idemgrpc/doc.go
	e, err := idem.New(store)
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
		recovery, auth, // outside idem
		idemgrpc.UnaryServerInterceptor(e, idemgrpc.WithScope(userID)),
	))

	conn, err := grpc.NewClient(addr, grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor()))
	// doc end
	_, _, _ = srv, conn, err
}

func idemhttpDoc() {
	mux := http.NewServeMux()
	var userID func(*http.Request) string
	var payments http.Handler
	// doc: adapters/idemhttp/idemhttp.go
	e, err := idem.New(store)
	mux.Handle("POST /v1/payments", idemhttp.New(e, idemhttp.WithScope(userID))(payments))
	// doc end
	_ = err
}

func idemclientDoc() {
	var body io.Reader
	// doc: client/idemclient/doc.go
	client := &http.Client{Transport: idemclient.New()}
	resp, err := client.Post(url, "application/json", body) // key, retries, replay
	// doc end
	_, _ = resp, err
	var userID, orderID string
	ctx := ctx
	// doc: client/idemclient/doc.go
	ctx = idemclient.WithKey(ctx, idemclient.Key(userID, orderID))
	// doc end
	_ = ctx
}

func recoveryPrincipalDoc() {
	var eng *idem.Engine
	var r *http.Request
	var withUser func(context.Context, string) context.Context
	ctx := ctx
	// doc: core/recover.go
	if p, ok := eng.RecoveryPrincipal(r.Header.Get(idem.RecoveryHeader)); ok {
		ctx = withUser(ctx, p) // the principal the adapter's scope function returns
	} else {
		// check the credential
	}
	// doc end
	_ = ctx
}

func routeDoc() {
	// doc: core/route.go
	idem.WithRoute("POST", "/v1/exports", idem.RouteLease(2*time.Minute), idem.RouteRetention(time.Hour))
	// doc end
}

func idemotelDoc() {
	var mp metric.MeterProvider
	// doc: observability/idemotel/doc.go
	hook, err := idemotel.NewEventHook(idemotel.WithMeterProvider(mp))
	engine, err := idem.New(store, idem.WithEventHook(hook))
	// doc end
	_, _ = engine, err
}

func outboxDoc() {
	var db *sql.DB
	var js jetstream.JetStream
	var p struct{ ID string }
	// doc: outbox/doc.go
	ob, _ := outbox.New(outbox.PostgreSQL, outbox.WithTable("payments_outbox"))
	_ = ob.EnsureSchema(ctx, db) // db: *sql.DB
	// in the handler, inside idem:
	tx, _ := pgstore.Tx(ctx)
	_ = ob.Enqueue(ctx, outbox.Pgx(tx), outbox.Message{ID: "payment.created:" + p.ID, Key: p.ID, Subject: "payment.created", Payload: body})
	// in one or more relay processes:
	relay, _ := outbox.NewRelay(db, ob, idemnats.NewPublisher(js))
	go relay.Run(ctx)
	// doc end
}

var (
	_ = connect.NewRequest[struct{}]
	_ = idemconnect.NewInterceptor
	_ = idemgin.New
	_ = idemgrpc.UnaryClientInterceptor
	_ = idemhttp.New
	_ = idemnats.NewPublisher
	_ = pgstore.Tx
)
