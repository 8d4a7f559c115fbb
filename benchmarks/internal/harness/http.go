package harness

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/idemkit/idem/adapters/idemgin"
	"github.com/idemkit/idem/adapters/idemhttp"
	idem "github.com/idemkit/idem/core"
)

// Executions counts handler runs, so that replay and conflict cases can
// assert that the handler did not run.
var Executions atomic.Int64

// KeyCounts, when set, counts the handlers' executions per idempotency key
// (Duplicates); ExecDelay makes each counted execution last long enough
// for concurrent duplicates to overlap it.
var (
	KeyCounts atomic.Pointer[sync.Map] // key -> *atomic.Int64
	ExecDelay = 2 * time.Millisecond
)

// CountKey records one execution of key and sleeps ExecDelay when
// KeyCounts is set.
func CountKey(key string) {
	m := KeyCounts.Load()
	if m == nil {
		return
	}
	v, ok := m.Load(key)
	if !ok { // fasthttp's strings alias its buffers: the map keeps a copy
		v, _ = m.LoadOrStore(strings.Clone(key), new(atomic.Int64))
	}
	v.(*atomic.Int64).Add(1)
	time.Sleep(ExecDelay)
}

// HandleHTTP is the net/http handler of every case: it reads the body and
// answers 201 (200 to GET) with RespBody.
func HandleHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	Executions.Add(1)
	if KeyCounts.Load() != nil {
		CountKey(r.Header.Get(idem.DefaultHeader))
	}
	w.Header().Set("Content-Type", "application/json")
	if r.Method == http.MethodGet {
		w.WriteHeader(http.StatusOK)
	} else {
		w.WriteHeader(http.StatusCreated)
	}
	_, _ = w.Write(RespBody)
}

// GinHandler is HandleHTTP for Gin.
func GinHandler(c *gin.Context) {
	_, _ = io.Copy(io.Discard, c.Request.Body)
	Executions.Add(1)
	if KeyCounts.Load() != nil {
		CountKey(c.GetHeader(idem.DefaultHeader))
	}
	status := http.StatusCreated
	if c.Request.Method == http.MethodGet {
		status = http.StatusOK
	}
	c.Data(status, "application/json", RespBody)
}

// NetHTTPApp is the net/http app: a ServeMux routing POST and GET Route to
// HandleHTTP wrapped in mw (none when nil).
func NetHTTPApp(mw func(http.Handler) http.Handler) http.Handler {
	var h http.Handler = http.HandlerFunc(HandleHTTP)
	if mw != nil {
		h = mw(h)
	}
	mux := http.NewServeMux()
	mux.Handle("POST "+Route, h)
	mux.Handle("GET "+Route, h)
	return mux
}

// GinApp is the Gin app (release mode): mw (none when nil) mounted with
// Use, POST and GET Route to GinHandler.
func GinApp(mw gin.HandlerFunc) http.Handler {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	if mw != nil {
		r.Use(mw)
	}
	r.POST(Route, GinHandler)
	r.GET(Route, GinHandler)
	return r
}

// IdemHTTP is idem's net/http middleware on e, scoped by Principal.
func IdemHTTP(e *idem.Engine) func(http.Handler) http.Handler {
	return idemhttp.New(e, idemhttp.WithScope(func(*http.Request) string { return Principal }))
}

// IdemGin is idem's Gin middleware on e, scoped by Principal.
func IdemGin(e *idem.Engine) gin.HandlerFunc {
	return idemgin.New(e, idemgin.WithScope(func(*gin.Context) string { return Principal }))
}

// HTTPDriver drives an http.Handler with reused requests and a fresh
// httptest.ResponseRecorder per request: one in-process request, no
// network.
type HTTPDriver struct {
	H         http.Handler
	post, get *http.Request
	body      *bytes.Reader
	rc        io.ReadCloser
	keys      []string
}

// NewHTTPDriver returns a driver of h sending ReqBody as Principal.
func NewHTTPDriver(h http.Handler) *HTTPDriver {
	d := &HTTPDriver{H: h, body: bytes.NewReader(ReqBody), keys: []string{""}}
	d.rc = io.NopCloser(d.body)
	d.post = httptest.NewRequest(http.MethodPost, Route, nil)
	d.post.Header.Set("Content-Type", "application/json")
	d.post.ContentLength = int64(len(ReqBody))
	d.get = httptest.NewRequest(http.MethodGet, Route, nil)
	for _, r := range []*http.Request{d.post, d.get} {
		r.Header.Set("X-User-Id", Principal)
	}
	return d
}

// Do sends one request (POST with ReqBody, or GET) with key (none when
// empty) and returns the status. Not safe for concurrent use: see
// ConcurrentHTTP.
func (d *HTTPDriver) Do(method, key string) int {
	r := d.post
	if method == http.MethodGet {
		r = d.get
	}
	d.body.Reset(ReqBody)
	r.Body = d.rc
	if key != "" {
		d.keys[0] = key
		r.Header[idem.DefaultHeader] = d.keys
	}
	w := httptest.NewRecorder()
	d.H.ServeHTTP(w, r)
	return w.Code
}

// ConcurrentHTTP returns a request function for h that goroutines may call
// at the same time: a POST of ReqBody as Principal with the key given.
func ConcurrentHTTP(h http.Handler) func(key string) Answer {
	return func(key string) Answer {
		r := httptest.NewRequest(http.MethodPost, Route, bytes.NewReader(ReqBody))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("X-User-Id", Principal)
		r.Header.Set(idem.DefaultHeader, key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return Answer{Status: w.Code, RetryAfter: w.Header().Get("Retry-After")}
	}
}
