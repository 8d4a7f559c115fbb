package chaos

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	tpclient "github.com/Shopify/toxiproxy/v2/client"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
)

var soakFor = flag.Duration("soak", 0, "run TestSoak for this long per store (0: the short version, about 10s per store)")

// frameworks maps an example name to its binary, built with -race by TestMain.
var frameworks = map[string]string{}

// frameworkNames lists the built examples in a stable order.
var frameworkNames []string

var tmpRoot string

func TestMain(m *testing.M) {
	flag.Parse()
	// The scenarios mostly wait on leases and timeouts, not on the CPU: run
	// more of them at once than -parallel's default (GOMAXPROCS), unless set.
	if f := flag.Lookup("test.parallel"); f != nil && f.Value.String() == strconv.Itoa(runtime.GOMAXPROCS(0)) {
		_ = f.Value.Set("6")
	}
	code := func() int {
		var err error
		if tmpRoot, err = os.MkdirTemp("", "idem-chaos-"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(tmpRoot)
		for _, name := range []string{"nethttp", "gin"} {
			bin, err := build(tmpRoot, name)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			frameworks[name] = bin
			frameworkNames = append(frameworkNames, name)
		}
		return m.Run()
	}()
	os.Exit(code)
}

// build compiles the payments service (examples/payments, run with
// -framework name) with the race detector, so that a data race inside a
// service under faults shows up in its stderr (checked by stop).
func build(dir, name string) (string, error) {
	bin := filepath.Join(dir, "payments")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	cmd := exec.Command("go", "build", "-race", "-o", bin, "./payments")
	cmd.Dir = filepath.Join("..", "..", "examples")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build examples/payments for %s: %w\n%s", name, err, out)
	}
	return bin, nil
}

// need fails the test when CI=true, else skips it.
func need(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

// ---- example service processes ----

// service is one running instance of an example service.
type service struct {
	t    testing.TB
	name string
	bin  string
	args []string
	URL  string
	addr string

	cmd  *exec.Cmd
	done chan struct{}

	mu     sync.Mutex
	stderr bytes.Buffer
	final  int64 // from the "executions N" line printed on a clean stop; -1 until then
	paused int   // "paused" lines: handlers held by -pause-after-record
}

// startService runs the example bin with args on addr ("" picks a free port)
// and waits for its "listening on" line. The process is killed at cleanup.
func startService(t testing.TB, framework, addr string, args ...string) *service {
	t.Helper()
	bin, ok := frameworks[framework]
	if !ok {
		t.Fatalf("examples/%s is not built", framework)
	}
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	s := &service{t: t, name: framework, bin: bin, args: args, addr: addr}
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.kill() })
	return s
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (s *service) start() error {
	cmd := exec.Command(s.bin, append(append([]string{"-framework", s.name}, s.args...), "-addr", s.addr)...)
	cmd.Stderr = lockedWriter{&s.mu, &s.stderr}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	s.mu.Lock()
	s.cmd, s.done, s.final = cmd, make(chan struct{}), -1
	s.mu.Unlock()
	done := s.done
	url := make(chan string, 1)
	lines := make(chan struct{})
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			if u, ok := strings.CutPrefix(line, "listening on "); ok {
				url <- u
			}
			if strings.HasPrefix(line, "paused") {
				s.mu.Lock()
				s.paused++
				s.mu.Unlock()
			}
			if n, ok := strings.CutPrefix(line, "executions "); ok {
				v, _ := strconv.ParseInt(n, 10, 64)
				s.mu.Lock()
				s.final = v
				s.mu.Unlock()
			}
		}
	}()
	go func() { <-lines; _ = cmd.Wait(); close(done) }()
	select {
	case u := <-url:
		if s.URL != u { // a restart keeps the port: the URL stays, readers need no lock
			s.URL = u
			s.addr = strings.TrimPrefix(u, "http://")
		}
		return nil
	case <-done:
		return fmt.Errorf("%s exited before listening:\n%s", s.name, s.logs())
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("%s did not listen within 30s", s.name)
	}
}

// logs returns the service's stderr so far.
func (s *service) logs() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stderr.String()
}

func (s *service) checkRaces() {
	if l := s.logs(); strings.Contains(l, "WARNING: DATA RACE") {
		s.t.Errorf("%s (%s): data race in the service:\n%s", s.name, s.URL, l)
	}
}

// stop sends SIGTERM, waits for the exit and returns the execution count the
// service printed on its way out (exact: in-flight handlers finish first).
//
// The client's idle connections are closed first: http.Server.Shutdown
// waits up to 5s for a connection that never sent a request (one the
// client's Transport dialled and then did not need, net/http issue 22682).
func (s *service) stop() int64 {
	httpClient.CloseIdleConnections()
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(20 * time.Second):
		s.t.Errorf("%s did not stop within 20s of SIGTERM", s.name)
		s.kill()
	}
	s.checkRaces()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.final < 0 {
		s.t.Errorf("%s stopped without printing its execution count:\n%s", s.name, s.stderr.String())
	}
	return s.final
}

// kill sends SIGKILL (a crash: nothing deferred runs) and waits for the exit.
func (s *service) kill() {
	_ = s.cmd.Process.Kill()
	<-s.done
	s.checkRaces()
}

// restart starts the same binary with the same flags on the same port.
func (s *service) restart() error {
	var err error
	for range 50 { // the port may be briefly unavailable
		if err = s.start(); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}

var httpClient = &http.Client{
	Timeout:   20 * time.Second,
	Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 5 * time.Second},
}

// executions returns GET /v1/stats's count: executions that reached the provider.
func (s *service) executions() int64 {
	s.t.Helper()
	n, err := statsOf(s.URL)
	if err != nil {
		s.t.Fatalf("%s stats: %v", s.name, err)
	}
	return n
}

func statsOf(url string) (int64, error) {
	resp, err := httpClient.Get(url + "/v1/stats")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var st struct {
		Executions int64 `json:"executions"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return 0, err
	}
	return st.Executions, nil
}

// waitExecutions polls s until its count reaches n (the handler reached the
// provider) or 30s pass.
func (s *service) waitExecutions(n int64) {
	s.t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if s.executions() >= n {
			return
		}
	}
	s.t.Fatalf("%s: executions did not reach %d", s.name, n)
}

// waitPaused waits until n handlers printed "paused" (-pause-after-record:
// their payment row is written, their completion not yet run), or 30s pass
// (as waitExecutions: a request through a loaded machine's race-built
// service; it takes milliseconds on a quiet one).
func (s *service) waitPaused(n int) {
	s.t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		s.mu.Lock()
		p := s.paused
		s.mu.Unlock()
		if p >= n {
			return
		}
	}
	s.t.Fatalf("%s: %d handlers did not pause within 30s:\n%s", s.name, n, s.logs())
}

// ---- HTTP client side ----

// answer is what a client saw for one POST /v1/payments.
type answer struct {
	status   int
	replayed bool
	id       string // payment id of a 201
	retry    string // Retry-After of a 409 or 503
	problem  string // the problem type's fragment of an error, e.g. "in-progress"
	err      error  // transport error: no answer
	at       time.Time
	took     time.Duration
}

func (a answer) String() string {
	if a.err != nil {
		return "error(" + a.err.Error() + ")"
	}
	s := strconv.Itoa(a.status)
	if a.replayed {
		s += "(replay)"
	}
	if a.problem != "" {
		s += " " + a.problem
	}
	return s
}

func newKey() string { return rand.Text() }

// pay sends POST /v1/payments with the idempotency key and amount (in minor units).
func pay(url, user, key string, amount int) answer {
	return payCtx(context.Background(), url, user, key, amount)
}

func payCtx(ctx context.Context, url, user, key string, amount int) answer {
	body := fmt.Sprintf(`{"amount":%d,"currency":"eur"}`, amount)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/payments", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User-ID", user)
	req.Header.Set("Idempotency-Key", key)
	// net/http's Transport silently resends a request carrying an
	// Idempotency-Key header when its connection breaks (Request.isReplayable);
	// without GetBody it can't, so every cut-off request is seen and counted.
	req.GetBody = nil
	start := time.Now()
	resp, err := httpClient.Do(req)
	if err != nil {
		return answer{err: err, at: start, took: time.Since(start)}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{err: err, at: start, took: time.Since(start)}
	}
	a := answer{status: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed") == "true", retry: resp.Header.Get("Retry-After"), at: start, took: time.Since(start)}
	if resp.Header.Get("Content-Type") == "application/problem+json" {
		var p struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal(b, &p)
		_, a.problem, _ = strings.Cut(p.Type, "#")
	}
	if a.status == http.StatusCreated {
		var p struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(b, &p); err != nil || p.ID == "" {
			a.err = fmt.Errorf("201 without a payment id: %q", b)
		}
		a.id = p.ID
	}
	return a
}

// async runs pay in the background.
func async(url, user, key string, amount int) <-chan answer {
	c := make(chan answer, 1)
	go func() { c <- pay(url, user, key, amount) }()
	return c
}

// retryUntil sends the same request every pause until done(answer) or the
// time limit; it returns every answer in order and when the last was sent.
func retryUntil(url, user, key string, amount int, pause, limit time.Duration, done func(answer) bool) []answer {
	var out []answer
	for deadline := time.Now().Add(limit); ; {
		a := pay(url, user, key, amount)
		out = append(out, a)
		if done(a) || time.Now().After(deadline) {
			return out
		}
		time.Sleep(pause)
	}
}

// summary counts answers by their String.
func summary(as []answer) map[string]int {
	m := map[string]int{}
	for _, a := range as {
		k := a.String()
		if a.err != nil {
			k = "error"
		}
		m[k]++
	}
	return m
}

// ---- stores ----

// freePort asks the kernel for a free loopback port.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// redisServer is a redis-server process of this test's own, so that it can be
// killed, restarted and scanned without touching the shared Redis.
type redisServer struct {
	t    testing.TB
	bin  string
	port int
	dir  string
	args []string
	cmd  *exec.Cmd
	done chan struct{}
	log  bytes.Buffer
	c    *redis.Client
}

func startRedis(t testing.TB, args ...string) *redisServer {
	t.Helper()
	bin := os.Getenv("IDEM_REDIS_SERVER_BIN")
	if bin == "" {
		var err error
		if bin, err = exec.LookPath("redis-server"); err != nil {
			need(t, "no redis-server on PATH and IDEM_REDIS_SERVER_BIN unset")
		}
	}
	r := &redisServer{t: t, bin: bin, port: freePort(t), dir: t.TempDir(), args: args}
	r.start()
	r.c = redis.NewClient(&redis.Options{Addr: r.Addr()})
	t.Cleanup(func() {
		_ = r.c.Close()
		r.kill()
	})
	return r
}

func (r *redisServer) Addr() string { return fmt.Sprintf("127.0.0.1:%d", r.port) }

func (r *redisServer) start() {
	r.t.Helper()
	args := append([]string{"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--dir", r.dir,
		"--save", "", "--appendonly", "no", "--protected-mode", "no"}, r.args...)
	r.cmd = exec.Command(r.bin, args...)
	r.log.Reset()
	r.cmd.Stdout, r.cmd.Stderr = &r.log, &r.log
	if err := r.cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	r.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); close(done) }(r.cmd, r.done)
	c := redis.NewClient(&redis.Options{Addr: r.Addr(), MaxRetries: -1})
	defer c.Close()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if c.Ping(context.Background()).Err() == nil {
			return
		}
	}
	r.t.Fatalf("redis-server on %s did not start:\n%s", r.Addr(), r.log.String())
}

// kill SIGKILLs the server: what was not persisted is lost.
func (r *redisServer) kill() {
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	<-r.done
	r.cmd = nil
}

// inProgress returns the keys under the default prefix whose record is in
// progress (state "1").
func (r *redisServer) inProgress(ctx context.Context) ([]string, int, error) {
	var stuck []string
	total := 0
	iter := r.c.Scan(ctx, 0, "idem:*", 1000).Iterator()
	for iter.Next(ctx) {
		total++
		// The state byte; "" when the key expired between SCAN and GETRANGE.
		st, err := r.c.GetRange(ctx, iter.Val(), 0, 0).Result()
		if err != nil {
			return nil, 0, err
		}
		if st == "1" {
			stuck = append(stuck, iter.Val())
		}
	}
	return stuck, total, iter.Err()
}

// ferret is a FerretDB test server process (tools/ferretdb) of this test's own.
type ferret struct {
	t    testing.TB
	cmd  *exec.Cmd
	done chan struct{}
	Addr string // host:port
}

func startFerret(t testing.TB) *ferret {
	t.Helper()
	bin := os.Getenv("IDEM_FERRETDB_BIN")
	if bin == "" {
		need(t, "IDEM_FERRETDB_BIN unset (scripts/services.sh builds tools/ferretdb and exports it)")
	}
	f := &ferret{t: t, cmd: exec.Command(bin, "-addr", "127.0.0.1:0"), done: make(chan struct{})}
	var log bytes.Buffer
	f.cmd.Stderr = &log
	out, err := f.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := f.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	uri := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "mongodb://") {
				uri <- sc.Text()
			}
		}
		_ = f.cmd.Wait()
		close(f.done)
	}()
	t.Cleanup(func() {
		_ = f.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-f.done:
		case <-time.After(10 * time.Second):
			_ = f.cmd.Process.Kill()
			<-f.done
		}
	})
	select {
	case u := <-uri:
		f.Addr = strings.TrimSuffix(strings.TrimPrefix(u, "mongodb://"), "/")
		return f
	case <-f.done:
		t.Fatalf("FerretDB exited before listening:\n%s", log.String())
	case <-time.After(60 * time.Second):
		t.Fatal("FerretDB did not start within 60s")
	}
	return nil
}

// ---- toxiproxy ----

// toxi is an in-process toxiproxy server (library github.com/Shopify/toxiproxy/v2)
// on a free loopback port, driven through its own Go client.
type toxi struct {
	c *tpclient.Client
}

var (
	toxiOnce sync.Once
	toxiSrv  *toxi
	toxiErr  error
)

// toxiproxyServer starts the shared toxiproxy API server once per test binary.
func toxiproxyServer(t testing.TB) *toxi {
	t.Helper()
	toxiOnce.Do(func() {
		api := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			toxiErr = err
			return
		}
		srv := &http.Server{Handler: api.Routes(), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		toxiSrv = &toxi{c: tpclient.NewClient(ln.Addr().String())}
	})
	if toxiErr != nil {
		t.Fatal(toxiErr)
	}
	return toxiSrv
}

// proxy is one toxiproxy proxy in front of a store.
type proxy struct {
	t *testing.T
	p *tpclient.Proxy
}

// newProxy creates a proxy from a free loopback port to upstream (host:port);
// it is deleted at cleanup.
func newProxy(t *testing.T, upstream string) *proxy {
	t.Helper()
	tx := toxiproxyServer(t)
	p, err := tx.c.CreateProxy(strings.ToLower(strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()))+"_"+rand.Text()[:6], "127.0.0.1:0", upstream)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Delete() })
	return &proxy{t: t, p: p}
}

// Addr is where clients connect: host:port.
func (p *proxy) Addr() string { return p.p.Listen }

func (p *proxy) disable() {
	p.t.Helper()
	if err := p.p.Disable(); err != nil {
		p.t.Fatal(err)
	}
}

func (p *proxy) enable() {
	p.t.Helper()
	if err := p.p.Enable(); err != nil {
		p.t.Fatal(err)
	}
}

// toxic adds a toxic; stream is "upstream" (client → store: requests) or
// "downstream" (store → client: replies). It returns its remover.
func (p *proxy) toxic(kind, stream string, attrs tpclient.Attributes) func() {
	p.t.Helper()
	name := kind + "_" + stream
	if _, err := p.p.AddToxic(name, kind, stream, 1, attrs); err != nil {
		p.t.Fatal(err)
	}
	return func() {
		if err := p.p.RemoveToxic(name); err != nil {
			p.t.Errorf("remove toxic %s: %v", name, err)
		}
	}
}

// hexID is a short random hex string for users.
func hexID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
