package client

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
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
	"github.com/rs/zerolog"
	"go.uber.org/goleak"
)

// frameworks lists the -framework values of the payments service
// (examples/payments) the tests run.
var frameworks = []string{"nethttp", "gin", "echo", "echov5", "fiber", "fiberv3"}

// binDir holds the example binaries TestMain builds.
var binDir string

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" { // this binary re-executed as a client process (restart_test.go)
		os.Exit(child())
	}
	flag.Parse()
	// The runs mostly wait on the network, not on the CPU.
	if f := flag.Lookup("test.parallel"); f != nil && f.Value.String() == strconv.Itoa(runtime.GOMAXPROCS(0)) {
		_ = f.Value.Set("8")
	}
	code := func() int {
		var err error
		if binDir, err = os.MkdirTemp("", "idem-client-e2e-"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(binDir)
		cmd := exec.Command("go", "build", "-o", filepath.Join(binDir, "payments"), "./payments")
		cmd.Dir = filepath.Join("..", "..", "examples")
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "go build examples: %v\n%s", err, out)
			return 1
		}
		code := m.Run()
		stopToxiproxy()
		if code == 0 {
			// toxiproxy's links wind down after their proxies are deleted
			// (a latency toxic finishes its sleep): give them time.
			err := goleak.Find()
			for deadline := time.Now().Add(15 * time.Second); err != nil && time.Now().Before(deadline); err = goleak.Find() {
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil {
				fmt.Fprintln(os.Stderr, "goleak:", err)
				return 1
			}
		}
		return code
	}()
	os.Exit(code)
}

func redisURL() string {
	if u := os.Getenv("IDEM_REDIS_URL"); u != "" {
		return u
	}
	return "redis://127.0.0.1:6379/0"
}

// ---- example service processes ----

// service is one running example service.
type service struct {
	t    testing.TB
	name string
	URL  string
	cmd  *exec.Cmd
	done chan struct{}

	mu     sync.Mutex
	stderr bytes.Buffer
	final  int64 // the "executions N" line printed on a clean stop; -1 until then
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

// startService runs examples/<framework> with args on a free port, waits for
// its "listening on" line, and kills it at cleanup unless stopped before.
func startService(t testing.TB, framework string, args ...string) *service {
	t.Helper()
	s := &service{t: t, name: framework, done: make(chan struct{}), final: -1}
	s.cmd = exec.Command(filepath.Join(binDir, "payments"), append(append([]string{"-framework", framework}, args...), "-addr", "127.0.0.1:0")...)
	s.cmd.Stderr = lockedWriter{&s.mu, &s.stderr}
	out, err := s.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	url := make(chan string, 1)
	lines := make(chan struct{})
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if u, ok := strings.CutPrefix(sc.Text(), "listening on "); ok {
				url <- u
			}
			if n, ok := strings.CutPrefix(sc.Text(), "executions "); ok {
				v, _ := strconv.ParseInt(n, 10, 64)
				s.mu.Lock()
				s.final = v
				s.mu.Unlock()
			}
		}
	}()
	go func() { <-lines; _ = s.cmd.Wait(); close(s.done) }()
	t.Cleanup(func() { _ = s.cmd.Process.Kill(); <-s.done })
	select {
	case s.URL = <-url:
		return s
	case <-s.done:
		t.Fatalf("%s exited before listening:\n%s", framework, s.logs())
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not listen within 60s", framework)
	}
	return nil
}

func (s *service) logs() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stderr.String()
}

// stop sends SIGTERM and returns the executions the service printed on its
// way out: exact, in-flight handlers finish first.
func (s *service) stop() int64 {
	s.t.Helper()
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		s.t.Fatalf("%s did not stop within 30s of SIGTERM", s.name)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.final < 0 {
		s.t.Fatalf("%s stopped without printing its executions:\n%s", s.name, s.stderr.String())
	}
	return s.final
}

// executions returns GET /v1/stats's count, sent past the proxy.
func (s *service) executions() int64 {
	s.t.Helper()
	c := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(s.URL + "/v1/stats")
	if err != nil {
		s.t.Fatalf("%s stats: %v", s.name, err)
	}
	defer resp.Body.Close()
	var st struct {
		Executions int64 `json:"executions"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		s.t.Fatalf("%s stats: %v", s.name, err)
	}
	return st.Executions
}

// ---- toxiproxy ----

var (
	toxiOnce sync.Once
	toxiHTTP *http.Server
	toxiC    *tpclient.Client
	toxiErr  error
)

// toxi returns the client of the in-process toxiproxy API server, started
// once per test binary.
func toxi(t testing.TB) *tpclient.Client {
	t.Helper()
	toxiOnce.Do(func() {
		api := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			toxiErr = err
			return
		}
		toxiHTTP = &http.Server{Handler: api.Routes(), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = toxiHTTP.Serve(ln) }()
		toxiC = tpclient.NewClient(ln.Addr().String())
	})
	if toxiErr != nil {
		t.Fatal(toxiErr)
	}
	return toxiC
}

func stopToxiproxy() {
	if toxiHTTP != nil {
		_ = toxiHTTP.Shutdown(context.Background())
	}
}

// newProxy creates a proxy from a free loopback port to the service at url
// (http://host:port); it is deleted at cleanup. It returns the proxy and its
// URL.
func newProxy(t *testing.T, url string) (*tpclient.Proxy, string) {
	t.Helper()
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()) + "_" + rand.Text()[:6]
	p, err := toxi(t).CreateProxy(name, "127.0.0.1:0", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Delete(); err != nil && !errors.Is(err, net.ErrClosed) {
			t.Errorf("delete proxy: %v", err)
		}
	})
	return p, "http://" + p.Listen
}

// addToxic adds a toxic named name on the replies (downstream) that hits a
// share toxicity of the connections.
func addToxic(t *testing.T, p *tpclient.Proxy, name, kind string, toxicity float32, attrs tpclient.Attributes) {
	t.Helper()
	if _, err := p.AddToxic(name, kind, "downstream", toxicity, attrs); err != nil {
		t.Fatal(err)
	}
}
