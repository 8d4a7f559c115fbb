package docs

import (
	"context"
	"database/sql"
	"log"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"github.com/gin-gonic/gin"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/idemkit/idem/adapters/idemconnect"
	"github.com/idemkit/idem/adapters/idemgrpc"
	"github.com/idemkit/idem/adapters/idemhttp"
	"github.com/idemkit/idem/adapters/idemnats"
	"github.com/idemkit/idem/client/idemclient"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/examples/grpc/gen/paymentsv1/paymentsv1connect"
	"github.com/idemkit/idem/observability/idemotel"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/stores/memstore"
	"github.com/idemkit/idem/stores/mongostore"
	"github.com/idemkit/idem/stores/mysqlstore"
	"github.com/idemkit/idem/stores/pgstore"
	"github.com/idemkit/idem/stores/redisstore"
)

// What the fragments take as given: the service's context, store, engine,
// router and request.
var (
	ctx    = context.Background()
	store  idem.Store
	engine *idem.Engine
	url    = "http://127.0.0.1:8080"
	body   []byte
)

func readmeNetHTTP() {
	mux := http.NewServeMux()
	var userIDFrom func(context.Context) string
	var auth func(http.Handler) http.Handler
	var createPayment func(http.ResponseWriter, *http.Request)
	// doc: README.md
	store := memstore.New() // one process; redisstore, mongostore, pgstore or mysqlstore with several instances
	defer store.Close()
	engine, err := idem.New(store) // POST and PATCH need a key; 24h retention, 30s lease
	if err != nil {
		log.Fatal(err)
	}
	idempotent := idemhttp.New(engine, idemhttp.WithScope(func(r *http.Request) string {
		return userIDFrom(r.Context()) // the principal your auth middleware stored
	}))
	mux.Handle("POST /v1/payments", auth(idempotent(http.HandlerFunc(createPayment))))
	// after srv.Shutdown: engine.Close(ctx) waits for completions still retrying after a store error
	// doc end
}

type authorizer struct{}

func (authorizer) Allow(ctx context.Context, principal, method, path string) error { return nil }

func readmeReplayCheck() {
	var authz authorizer
	// doc: README.md
	engine, err := idem.New(store, idem.WithReplayCheck(func(ctx context.Context, info idem.ReplayInfo) error {
		return authz.Allow(ctx, info.Principal, info.Method, info.Path) // your permission check
	}))
	// doc end
	_, _ = engine, err
}

func readmeClient() {
	body := http.NoBody
	// doc: README.md
	client := &http.Client{Transport: idemclient.New()} // wraps http.DefaultTransport; idemclient.WithBase(yours)
	resp, err := client.Post(url+"/v1/payments", "application/json", body)
	// resp: the final answer; idemclient.Replayed(resp), idemclient.Attempts(resp), idemclient.RequestKey(resp)
	var gaveUp *idemclient.GaveUpError // errors.As(err, &gaveUp): gaveUp.Key, .Attempts, .StatusCode, .RetryAfter, .Err, .Reason
	var final *idemclient.OutcomeError // errors.As(err, &final): final.Outcome, .Key, .Detail; errors.Is(err, idemclient.ErrUncertain), ...
	// doc end
	_, _, _, _ = resp, err, gaveUp, final
}

func readmeGRPC() {
	var recovery, auth grpc.UnaryServerInterceptor
	var userID func(context.Context) string
	var addr string
	var creds credentials.TransportCredentials
	// doc: README.md
	// grpc-go: recovery and authentication outside idem
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(recovery, auth,
		idemgrpc.UnaryServerInterceptor(engine, idemgrpc.WithScope(userID)))) // userID(ctx): the principal auth stored
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds), // insecure.NewCredentials() on loopback
		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor()))
	// doc end
	_, _, _ = srv, conn, err
}

func readmeConnect() {
	var auth connect.Interceptor
	var userID func(context.Context) string
	var svc paymentsv1connect.PaymentsHandler
	// doc: README.md
	// connect-go
	path, h := paymentsv1connect.NewPaymentsHandler(svc, connect.WithInterceptors(auth,
		idemconnect.NewInterceptor(engine, idemconnect.WithScope(userID))))
	client := paymentsv1connect.NewPaymentsClient(http.DefaultClient, url,
		connect.WithInterceptors(idemconnect.NewClientInterceptor()))
	// doc end
	_, _, _ = path, h, client
}

func readmeRedis() {
	// doc: README.md
	// Redis (standalone, Sentinel or Cluster): stores/redisstore
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	store := redisstore.New(client, redisstore.WithPrefix("payments:idem:"))
	// doc end
	_ = store
}

func readmeMongo() {
	var client *mongo.Client
	// doc: README.md
	// MongoDB (driver v2; v1 is in maintenance mode): stores/mongostore
	coll := client.Database("payments").Collection("idempotency",
		options.Collection().SetWriteConcern(writeconcern.Majority()).SetReadPreference(readpref.Primary()))
	store := mongostore.New(coll)
	err := store.EnsureIndexes(ctx) // TTL index; where TTL indexes are missing, also store.StartPurger(10*time.Minute)
	// doc end
	_ = err
}

func readmePostgres() {
	var pool *pgxpool.Pool
	// doc: README.md
	// PostgreSQL (pgx v5 pool): stores/pgstore
	store := pgstore.New(pool, pgstore.WithTable("idem_records"))
	err := store.EnsureSchema(ctx) // or store.SchemaSQL() in your migrations; store.StartPurger(time.Hour) deletes expired rows
	// doc end
	_ = err
}

func readmeMySQL() {
	var r *http.Request
	var id string
	var amount int
	// doc: README.md
	db, err := sql.Open("mysql", "app:secret@tcp(db:3306)/payments")
	store := mysqlstore.New(db)        // table idem_records and its procedure idem_records_acquire_v5
	err = store.EnsureSchema(ctx)      // or store.SchemaSQL() in your migrations
	err = store.StartPurger(time.Hour) // deletes expired rows; store.Close() stops it
	engine, err := idem.New(store)

	// in a handler: the payment row commits with the stored response, or not at all
	tx, err := mysqlstore.Tx(r.Context())
	_, err = tx.ExecContext(r.Context(), `INSERT INTO payments (id, amount) VALUES (?, ?)`, id, amount)
	// doc end
	_, _ = engine, err
}

// Charge is the durable-steps fragment's provider answer.
type Charge struct{ ID string }

type chargeProvider struct{}

func (chargeProvider) Charge(ctx context.Context, key string, amount int) (Charge, error) {
	return Charge{}, nil
}

type mailSender struct{}

func (mailSender) Send(ctx context.Context, msg string) (string, error) { return "", nil }

func readmeSteps() {
	r := gin.New()
	var provider chargeProvider
	var mailer mailSender
	var amount int
	receiptFor := func(Charge) string { return "" }
	// doc: README.md
	r.POST("/v1/payments", func(c *gin.Context) {
		ctx := c.Request.Context()
		ch, err := idem.Step(ctx, "charge", func(ctx context.Context) (Charge, error) {
			key, _ := idem.DerivedKey(ctx)           // "idem-" + 64 hex: the same on every takeover
			return provider.Charge(ctx, key, amount) // Stripe-style: the same key, the same charge
		}, idem.Repeatable())
		if err != nil {
			c.Status(http.StatusBadGateway) // 5xx: the key is released (idem.ErrStepUncertain: it stays uncertain); or a 4xx the engine stores
			return
		}
		_, err = idem.Step(ctx, "receipt", func(ctx context.Context) (string, error) {
			return mailer.Send(ctx, receiptFor(ch)) // no key: a crash mid-send leaves it unknown
		})
		// ... the ledger row, the answer
	})
	// doc end
}

func readmeRecovery() {
	r := gin.New()
	var authenticate func(*gin.Context) bool
	// doc: README.md
	// RouteRecovery keeps, from the acquire on, what running the request again takes: method, route, path,
	// query, Content-Type, principal, idempotency key, body and the header lines named (never credentials)
	engine, err := idem.New(store, idem.WithRoute("POST", "/v1/payments", idem.RouteRecovery("X-Request-Source")))
	r.Use(func(c *gin.Context) { // the service's authentication
		if user, ok := engine.RecoveryPrincipal(c.GetHeader(idem.RecoveryHeader)); ok {
			c.Set("user_id", user) // a recovery run: the stored principal, no credential
		} else if !authenticate(c) { // every other request, a forged Idem-Recovery included
			c.AbortWithStatus(401)
			return
		}
	})
	rec, err := idem.NewRecoverer(engine, idem.RecoverRequests(idem.HTTPRunner(r))) // Fiber: idemfiber.Runner(app)

	rec.Start() // every instance runs one; or a process of its own with the same router and engine options
	defer rec.Stop()
	// doc end
	_ = err
}

func readmeRecoveryDo() {
	var rec *idem.Recoverer
	var sendReceipt func(context.Context) (string, error)
	// doc: README.md
	rec.Handle("send-receipt", func(ctx context.Context, op idem.Operation) error { // an idem.Do with Operation.Recover
		op.Codec = idem.JSONCodec
		_, err := idem.Do(ctx, engine, op, sendReceipt)
		return err
	})
	// doc end
}

// Receipt is what the jobs fragment's operation returns.
type Receipt struct{ ID string }

func readmeDo() {
	var event struct{ ID string }
	sendReceipt := func(context.Context, pgx.Tx, struct{ ID string }) (Receipt, error) { return Receipt{}, nil }
	// doc: README.md
	receipt, err := idem.Do(ctx, engine, idem.Operation{
		Scope:   "payments",     // whose key: a tenant, a stream or queue
		Name:    "send-receipt", // the operation
		Key:     event.ID,       // e.g. the message id
		Payload: body,           // fingerprinted: the same key with another payload is ErrMismatch
	}, func(ctx context.Context) (Receipt, error) {
		tx, err := pgstore.Tx(ctx) // with pgstore: committed with the record
		if err != nil {
			return Receipt{}, err
		}
		return sendReceipt(ctx, tx, event) // your work; its writes through tx commit with the record
	})
	// doc end
	_, _ = receipt, err
}

func readmeOutbox() {
	var db *sql.DB
	var js jetstream.JetStream
	var p struct{ ID string }
	// doc: README.md
	ob, err := outbox.New(outbox.PostgreSQL, outbox.WithTable("payments_outbox")) // or outbox.MySQL
	err = ob.EnsureSchema(ctx, db)                                                // db: *sql.DB (stdlib.OpenDBFromPool(pool) for pgx)

	// in the handler, inside idem (or mysqlstore.Tx, or your own *sql.Tx / pgx.Tx):
	tx, err := pgstore.Tx(ctx)
	err = ob.Enqueue(ctx, outbox.Pgx(tx), outbox.Message{ID: "payment.created:" + p.ID, Key: p.ID, Subject: "payment.created", Payload: body})

	// in any number of processes:
	relay, err := outbox.NewRelay(db, ob, idemnats.NewPublisher(js)) // or idemamqp.NewPublisher(dial, exchange), idemkafka.NewPublisher(client)
	go relay.Run(ctx)
	// doc end
	_ = err
}

func readmeEventHook() {
	// doc: README.md
	hook, err := idemotel.NewEventHook() // the global MeterProvider; idemotel.WithMeterProvider(mp) to choose
	engine, err := idem.New(store, idem.WithEventHook(hook))
	// doc end
	_, _ = engine, err
}

var (
	_ = redis.Nil
	_ = options.Client
	_ = readpref.Primary
	_ = writeconcern.Majority
	_ = mongostore.New
	_ = pgstore.New
	_ = mysqlstore.New
	_ = redisstore.New
	_ = idemgrpc.UnaryClientInterceptor
	_ = idemconnect.NewClientInterceptor
	_ = idemhttp.New
	_ = idemnats.NewPublisher
	_ = log.Fatal
	_ = time.Second
)
