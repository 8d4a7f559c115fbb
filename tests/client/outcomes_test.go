package client

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/adapters/idemhttp"
	"github.com/idemkit/idem/client/idemclient"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adaptertest"
	"github.com/idemkit/idem/stores/memstore"
)

// orders is an idemhttp service on a real listener: POST /orders answers
// 201 after counting an execution (held until release with ?hold=1);
// requests are counted per idempotency key outside idem.
type orders struct {
	URL        string
	executions atomic.Int64
	started    chan struct{}
	gate       chan struct{}
	mu         sync.Mutex
	seen       map[string]int
}

func startOrders(t *testing.T, e *idem.Engine) *orders {
	t.Helper()
	o := &orders{started: make(chan struct{}, 16), gate: make(chan struct{}), seen: map[string]int{}}
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.executions.Add(1)
		if r.URL.Query().Get("hold") != "" {
			o.started <- struct{}{}
			<-o.gate
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":"ord_1"}`)
	})
	protected := idemhttp.New(e, idemhttp.WithScope(func(*http.Request) string { return "alice" }))(app)
	count := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.mu.Lock()
		o.seen[r.Header.Get(idemclient.HeaderKey)]++
		o.mu.Unlock()
		protected.ServeHTTP(w, r)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: count, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		o.release()
		_ = srv.Close()
		<-done
	})
	o.URL = "http://" + ln.Addr().String()
	return o
}

func (o *orders) release() {
	o.mu.Lock()
	defer o.mu.Unlock()
	select {
	case <-o.gate:
	default:
		close(o.gate)
	}
}

func (o *orders) requests(key string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.seen[key]
}

// order sends POST target with key and body through c.
func order(ctx context.Context, c *http.Client, target, key, body string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idemclient.HeaderKey, key)
	resp, err := c.Do(req)
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
	return resp, err
}

// problemType returns the problem type of a response, or "".
func problemType(ctx context.Context, target, key, body string) string {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, target, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idemclient.HeaderKey, key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if i := strings.Index(string(b), idem.ProblemTypeBase); i >= 0 {
		rest := string(b[i+len(idem.ProblemTypeBase):])
		if j := strings.IndexByte(rest, '"'); j >= 0 {
			return rest[:j]
		}
	}
	return ""
}

// TestClientOutcomes drives an idemhttp service (net/http, a real engine)
// into operation-uncertain (an expired lease under
// WithUncertainAfterCrash), key-expired (a short retention with
// WithTombstones), replay-forbidden (a refusing WithReplayCheck),
// key-reused and fingerprint-changed (a record made under another
// fingerprint function), and asserts that idemclient sends the request
// once and returns an *OutcomeError of that outcome, matching its error.
func TestClientOutcomes(t *testing.T) {
	v1 := idem.NewFingerprinter("v1-test", func(dst []byte, _ string, body []byte) ([]byte, error) { return append(dst, body...), nil })
	refuse := idem.WithReplayCheck(func(context.Context, idem.ReplayInfo) error { return errors.New("permission revoked") })
	for _, c := range []struct {
		outcome idem.Outcome
		want    error
		opts    []idem.Option
		first   []idem.Option // another engine on the same store makes the record
		hold    bool
		other   bool
	}{
		{outcome: idem.OutcomeUncertain, want: idemclient.ErrUncertain, hold: true,
			opts: []idem.Option{idem.WithStoreTimeout(250 * time.Millisecond), idem.WithLease(time.Second), idem.WithUncertainAfterCrash(time.Hour)}},
		{outcome: idem.OutcomeKeyExpired, want: idemclient.ErrKeyExpired, opts: []idem.Option{idem.WithRetention(300 * time.Millisecond), idem.WithTombstones(time.Hour)}},
		{outcome: idem.OutcomeReplayForbidden, want: idemclient.ErrReplayForbidden, opts: []idem.Option{refuse}},
		{outcome: idem.OutcomeKeyReused, want: idemclient.ErrKeyReused, other: true},
		{outcome: idem.OutcomeFingerprintChanged, want: idemclient.ErrFingerprintChanged, first: []idem.Option{idem.WithFingerprint(v1)}},
	} {
		t.Run(c.outcome.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			mem := memstore.New()
			defer mem.Close()
			newEngine := func(opts ...idem.Option) *idem.Engine {
				e, err := idem.New(adaptertest.Crashable(mem), opts...)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = e.Close(context.Background()) })
				return e
			}
			svc := startOrders(t, newEngine(c.opts...))
			first := svc
			if c.first != nil {
				first = startOrders(t, newEngine(c.first...))
			}
			key := rand.Text()
			query, body := "", `{"sku":"A1"}`
			if c.hold {
				query = "?hold=1"
			}
			held := make(chan error, 1)
			go func() {
				resp, err := order(ctx, http.DefaultClient, first.URL+"/orders"+query, key, body) // not through idemclient
				if err == nil && resp.StatusCode != http.StatusCreated {
					err = errors.New(resp.Status)
				}
				held <- err
			}()
			if c.hold {
				<-first.started
			} else if err := <-held; err != nil {
				t.Fatal(err)
			}
			if c.other {
				body = `{"sku":"B2"}`
			}
			for deadline := time.Now().Add(20 * time.Second); problemType(ctx, svc.URL+"/orders"+query, key, body) != c.outcome.String(); time.Sleep(50 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the service never answered %s", c.outcome)
				}
			}
			before := svc.requests(key)
			var hooked int
			cl := &http.Client{Transport: idemclient.New(idemclient.WithAttemptHook(func(idemclient.Attempt) { hooked++ }))}
			defer cl.CloseIdleConnections()
			resp, err := order(ctx, cl, svc.URL+"/orders"+query, key, body) //nolint:bodyclose // closed by order
			var oe *idemclient.OutcomeError
			if !errors.As(err, &oe) || oe.Outcome != c.outcome || oe.Attempts != 1 || oe.Key != key || oe.Detail == "" ||
				!errors.Is(err, c.want) {
				t.Fatalf("response %v, err %v; want an *OutcomeError %s after 1 attempt", resp, err, c.outcome)
			}
			if n := svc.requests(key) - before; n != 1 || hooked != 1 {
				t.Fatalf("the service got %d requests, the hook saw %d attempts; want 1 and 1 (no retry)", n, hooked)
			}
			if c.hold {
				first.release()
				if err := <-held; err != nil {
					t.Fatalf("the slow first request: %v", err)
				}
			}
			if n := svc.executions.Load() + first.executions.Load()*boolInt(first != svc); n != 1 {
				t.Fatalf("%d executions, want 1", n)
			}
		})
	}
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// resetProxy is a TCP proxy that, once armed, resets (RST) the client
// connection on which it next reads request bytes, without forwarding
// them: a keep-alive connection broken before any response byte, the case
// where Go's transport re-sends the request by itself.
type resetProxy struct {
	ln     net.Listener
	target string
	armed  atomic.Bool
	resets atomic.Int64
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
}

func startResetProxy(t *testing.T, target string) *resetProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &resetProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		for c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *resetProxy) track(c net.Conn, add bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if add {
		p.conns[c] = struct{}{}
	} else {
		delete(p.conns, c)
	}
}

func (p *resetProxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		upstream, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		p.track(client, true)
		p.track(upstream, true)
		closeBoth := func() {
			_ = client.Close()
			_ = upstream.Close()
			p.track(client, false)
			p.track(upstream, false)
		}
		p.wg.Go(func() { _, _ = io.Copy(client, upstream); closeBoth() })
		p.wg.Go(func() {
			defer closeBoth()
			buf := make([]byte, 32<<10)
			for {
				n, err := client.Read(buf)
				if n > 0 && p.armed.CompareAndSwap(true, false) {
					p.resets.Add(1)
					_ = client.(*net.TCPConn).SetLinger(0) // Close sends RST
					return
				}
				if n > 0 {
					if _, werr := upstream.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		})
	}
}

// TestResendsCounted: through a proxy that resets the kept-alive
// connection as each order arrives, Go's transport re-sends the order on a
// new connection by itself; idemclient counts that re-send as an attempt
// (Attempts 2, the hook called for it with ErrResent) and the order
// executes once (issue 37: Attempts said 1 and the hook never ran).
func TestResendsCounted(t *testing.T) {
	mem := memstore.New()
	defer mem.Close()
	e, err := idem.New(mem)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.Close(context.Background()) }()
	svc := startOrders(t, e)
	px := startResetProxy(t, strings.TrimPrefix(svc.URL, "http://"))
	var mu sync.Mutex
	var resent, hooked int
	cl := &http.Client{Transport: idemclient.New(idemclient.WithAttemptHook(func(a idemclient.Attempt) {
		mu.Lock()
		defer mu.Unlock()
		hooked++
		if errors.Is(a.Err, idemclient.ErrResent) {
			resent++
		}
	}))}
	defer cl.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	target := "http://" + px.ln.Addr().String() + "/orders"
	if _, err := order(ctx, cl, target, "warm-up", `{"sku":"W"}`); err != nil { //nolint:bodyclose // closed by order
		t.Fatal(err)
	}
	const orders = 10
	for i := range orders {
		px.armed.Store(true)
		resp, err := order(ctx, cl, target, "order-"+string(rune('a'+i)), `{"sku":"A1"}`) //nolint:bodyclose // closed by order
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusCreated || idemclient.Attempts(resp) != 2 {
			t.Fatalf("order %d: %d after %d attempts; want 201 after 2 (one re-sent by net/http)", i, resp.StatusCode, idemclient.Attempts(resp))
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if px.resets.Load() != orders || resent != orders || hooked != 1+2*orders {
		t.Fatalf("%d resets, the hook saw %d attempts of which %d re-sends; want %d, %d, %d", px.resets.Load(), hooked, resent, orders, 1+2*orders, orders)
	}
	if n := svc.executions.Load(); n != 1+orders {
		t.Fatalf("%d executions, want %d", n, 1+orders)
	}
}
