// Package webhooks tests adapters/idemwebhook over real HTTP servers and
// real stores (memstore, the shared Redis, and a private redis-server that
// a test stops and starts), against stripe-go's own signer and verifier.
package webhooks

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/adapters/idemwebhook"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/memstore"
	"github.com/idemkit/idem/stores/redisstore"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// fasthttp's (Fiber's) process-wide Date header updater, started once.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		// fasthttp's worker pool cleaner sees the stop signal only after its
		// idle-worker sleep (10s) ends; it holds nothing of ours.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"))
}

// Secrets of the two simulated senders.
const (
	standardSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	stripeSecret   = "whsec_test_idem_webhooks"
)

func schemes(t *testing.T) (*idemwebhook.StandardWebhooks, *idemwebhook.Stripe) {
	t.Helper()
	std, err := idemwebhook.NewStandardWebhooks(standardSecret)
	if err != nil {
		t.Fatal(err)
	}
	st, err := idemwebhook.NewStripe(stripeSecret)
	if err != nil {
		t.Fatal(err)
	}
	return std, st
}

// redisURL is the shared Redis; the tests fail without it.
func redisURL(t *testing.T) string {
	t.Helper()
	u := os.Getenv("IDEM_REDIS_URL")
	if u == "" {
		u = "redis://127.0.0.1:6379/0"
	}
	return u
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%x", b)
}

// newStores returns the stores every receiver test runs on: memstore and
// the shared Redis under a key prefix of its own, deleted at cleanup.
func newStores() map[string]func(t *testing.T) idem.Store {
	return map[string]func(t *testing.T) idem.Store{
		"memory": func(t *testing.T) idem.Store {
			s := memstore.New()
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
		"redis": func(t *testing.T) idem.Store {
			opt, err := redis.ParseURL(redisURL(t))
			if err != nil {
				t.Fatal(err)
			}
			c := redis.NewClient(opt)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := c.Ping(ctx).Err(); err != nil {
				t.Fatalf("Redis at %s: %v (scripts/services.sh starts one)", redisURL(t), err)
			}
			prefix := "idem-webhooks-" + randomHex(6) + ":"
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				keys, _ := c.Keys(ctx, prefix+"*").Result()
				if len(keys) > 0 {
					c.Del(ctx, keys...)
				}
				_ = c.Close()
			})
			return redisstore.New(c, redisstore.WithPrefix(prefix))
		},
	}
}

// rig is a receiver with a Standard Webhooks endpoint (/standard) and a
// Stripe endpoint (/stripe) over a real listener, whose handler counts its
// runs per event and can hold an event until released.
type rig struct {
	t        *testing.T
	url      string
	std      *idemwebhook.StandardWebhooks
	stripe   *idemwebhook.Stripe
	client   *http.Client
	mu       sync.Mutex
	runs     map[string]int           // sender/id → handler runs
	holds    map[string]chan struct{} // id → closed to let the handler finish
	started  chan string              // ids whose handler started (buffered)
	failNext map[string]bool          // id → answer 500 once
}

// newRig builds the receivers on engine e and serves them with serve
// (nil: net/http), which returns the base URL.
func newRig(t *testing.T, e *idem.Engine, serve func(t *testing.T, standard, stripe http.Handler) string) *rig {
	t.Helper()
	std, st := schemes(t)
	rg := &rig{t: t, std: std, stripe: st, runs: map[string]int{}, holds: map[string]chan struct{}{},
		started: make(chan string, 256), failNext: map[string]bool{}, client: &http.Client{Timeout: 30 * time.Second}}
	h := http.HandlerFunc(rg.handle)
	standard := idemwebhook.New(e, "billing", std)(h)
	stripe := idemwebhook.New(e, "stripe", st)(h)
	if serve == nil {
		serve = serveMux
	}
	rg.url = serve(t, standard, stripe)
	t.Cleanup(rg.client.CloseIdleConnections)
	return rg
}

func serveMux(t *testing.T, standard, stripe http.Handler) string {
	mux := http.NewServeMux()
	mux.Handle("/standard", standard)
	mux.Handle("/stripe", stripe)
	return newServer(t, mux)
}

// newServer serves h on a loopback listener until the test ends and
// returns its URL.
func newServer(t *testing.T, h http.Handler) string {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// handle is the application's event handler: it checks that the body is
// the verified one, counts the run, and answers the event id and the run.
func (rg *rig) handle(w http.ResponseWriter, r *http.Request) {
	d, ok := idemwebhook.DeliveryFromContext(r.Context())
	if !ok {
		rg.t.Errorf("handler without a delivery in its context")
		http.Error(w, "no delivery", http.StatusInternalServerError)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil || len(body) == 0 {
		rg.t.Errorf("handler body: %v (%d bytes)", err, len(body))
	}
	rg.mu.Lock()
	rg.runs[d.Sender+"/"+d.ID]++
	n := rg.runs[d.Sender+"/"+d.ID]
	hold := rg.holds[d.ID]
	fail := rg.failNext[d.ID]
	delete(rg.failNext, d.ID)
	rg.mu.Unlock()
	select {
	case rg.started <- d.ID:
	default:
	}
	if hold != nil {
		<-hold
	}
	if fail {
		http.Error(w, "temporary failure", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = fmt.Fprintf(w, `{"event":%q,"run":%d,"sum":%d}`+"\n", d.ID, n, len(body))
}

func (rg *rig) runsOf(sender, id string) int {
	rg.mu.Lock()
	defer rg.mu.Unlock()
	return rg.runs[sender+"/"+id]
}

// hold makes the handler wait for release when it processes id.
func (rg *rig) hold(id string) (release func()) {
	ch := make(chan struct{})
	rg.mu.Lock()
	rg.holds[id] = ch
	rg.mu.Unlock()
	var once sync.Once
	release = func() { once.Do(func() { close(ch) }) }
	rg.t.Cleanup(release)
	return release
}

// standardBody and stripeBody are event payloads as each sender sends them.
func standardBody(id string) []byte {
	return []byte(`{"type":"invoice.paid","timestamp":"2026-12-04T06:00:00Z","data":{"invoice":"` + id + `","amount":1999}}`)
}

func stripeBody(id string) []byte {
	return []byte(`{"id":"` + id + `","object":"event","api_version":"2025-03-31.basil","type":"payment_intent.succeeded","data":{"object":{"id":"pi_1","amount":1999}}}`)
}

// answer is one delivery's answer.
type answer struct {
	Status     int
	Body       string
	Replayed   bool
	RetryAfter string
	Type       string // the problem type's anchor, for problems
}

func (a answer) String() string {
	return fmt.Sprintf("%d type=%q replayed=%v retry-after=%q body=%q", a.Status, a.Type, a.Replayed, a.RetryAfter, a.Body)
}

// post sends body with header to path and returns the answer.
func (rg *rig) post(ctx context.Context, path string, header http.Header, body []byte) (answer, error) {
	return rg.send(ctx, rg.url+path, header, body)
}

// postTo is post to the server at base.
func (rg *rig) postTo(base, path string, header http.Header, body []byte) (answer, error) {
	return rg.send(context.Background(), base+path, header, body)
}

func (rg *rig) send(ctx context.Context, url string, header http.Header, body []byte) (answer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := rg.client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, err
	}
	a := answer{Status: resp.StatusCode, Body: string(b), Replayed: resp.Header.Get(idem.ReplayedHeader) == "true", RetryAfter: resp.Header.Get("Retry-After")}
	if resp.Header.Get("Content-Type") == "application/problem+json" {
		var p idem.Problem
		if err := json.Unmarshal(b, &p); err != nil {
			return a, fmt.Errorf("problem body %q: %w", b, err)
		}
		a.Type = p.Type[len(idem.ProblemTypeBase):]
		if p.Status != resp.StatusCode {
			return a, fmt.Errorf("problem status %d on a %d answer", p.Status, resp.StatusCode)
		}
	}
	return a, nil
}

// deliverStandard sends a Standard Webhooks delivery of event id signed at
// ts (a sender signs every attempt anew).
func (rg *rig) deliverStandard(id string, ts time.Time, body []byte) answer {
	rg.t.Helper()
	a, err := rg.post(context.Background(), "/standard", rg.std.SignedHeader(id, ts, body), body)
	if err != nil {
		rg.t.Fatalf("delivery of %s: %v", id, err)
	}
	return a
}

// deliverStripe sends a Stripe delivery of body signed at ts.
func (rg *rig) deliverStripe(ts time.Time, body []byte) answer {
	rg.t.Helper()
	a, err := rg.post(context.Background(), "/stripe", rg.stripe.SignedHeader(ts, body), body)
	if err != nil {
		rg.t.Fatalf("delivery: %v", err)
	}
	return a
}

// newEngine returns an engine over store, closed at cleanup.
func newEngine(t *testing.T, store idem.Store, opts ...idem.Option) *idem.Engine {
	t.Helper()
	e, err := idem.New(store, append([]idem.Option{idem.WithRetention(96 * time.Hour)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = e.Close(ctx)
	})
	return e
}

// redisProc is a private redis-server, with an append-only file so that a
// restart keeps its records.
type redisProc struct {
	t    *testing.T
	addr string
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
}

func startRedis(t *testing.T, addr, dir string) *redisProc {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server: %v (scripts/services.sh installs it)", err)
	}
	_, port, _ := net.SplitHostPort(addr)
	p := &redisProc{t: t, addr: addr, dir: dir, done: make(chan struct{})}
	p.cmd = exec.Command(bin, "--port", port, "--bind", "127.0.0.1", "--dir", dir, "--save", "",
		"--appendonly", "yes", "--appendfsync", "always", "--daemonize", "no")
	out := &bytes.Buffer{}
	p.cmd.Stdout, p.cmd.Stderr = out, out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(p.stop)
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
			return p
		}
		select {
		case <-p.done:
			t.Fatalf("redis-server on %s exited: %s", addr, out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on %s not ready: %v\n%s", addr, err, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop kills the server and waits until it exited.
func (p *redisProc) stop() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

func newRedisStore(c *redis.Client) idem.Store {
	return redisstore.New(c, redisstore.WithPrefix("idem-webhooks-"+randomHex(6)+":"))
}

func privateRedis(t *testing.T) (*redisProc, *redis.Client) {
	p := startRedis(t, freeAddr(t), filepath.Join(t.TempDir()))
	c := redis.NewClient(&redis.Options{Addr: p.addr, MaxRetries: -1, DialTimeout: 500 * time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	return p, c
}
