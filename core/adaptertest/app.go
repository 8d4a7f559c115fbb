package adaptertest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	idem "github.com/idemkit/idem/core"
)

// PrincipalHeader is the request header the adapter's scope function must
// return as the principal in the suite's apps. (Real apps take the principal
// from their authentication, never from a client header.)
const PrincipalHeader = "X-Test-Principal"

// App is the handler every adapter mounts in the suite. Its behaviour is
// driven by query parameters:
//
//	status=N  answer with status N (default 201)
//	panic=1   panic
//	sleep=D   sleep D (a time.Duration) before answering
//	bytes=N   answer N bytes of application/octet-stream, byte i = i mod 251, NUL included
//	stream=1  write a first chunk, flush, wait for [App.Release], then write the rest
//	hold=1    wait for [App.Release] (at most 10s) before answering
//	panicafter=1  write the whole answer, flush it, then panic (post-processing failing after the work)
//	override=1  set X-Outer: handler, replacing the outer middleware's line (see [OuterHeaders])
//
// A JSON answer carries the execution number and the SHA-256 of the request
// body the handler read, and the headers Location, Set-Cookie, two X-Multi
// lines (one with a comma) and Content-Type.
type App struct {
	executions atomic.Int64
	release    chan struct{}
	once       sync.Once
	lastInfo   atomic.Pointer[idem.Info]
	lastUnit   atomic.Pointer[unitRef] // the Unit in the last handler's context (Transactional stores)
}

type unitRef struct{ u idem.Unit }

// NewApp returns an App with zero executions.
func NewApp() *App { return &App{release: make(chan struct{})} }

// Executions returns how many times a handler ran.
func (a *App) Executions() int64 { return a.executions.Load() }

// Release lets streaming handlers finish.
func (a *App) Release() { a.once.Do(func() { close(a.release) }) }

// ServeHTTP implements http.Handler.
func (a *App) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := a.executions.Add(1)
	if info, ok := idem.InfoFromContext(r.Context()); ok {
		a.lastInfo.Store(&info)
	}
	a.lastUnit.Store(&unitRef{idem.UnitFromContext(r.Context())})
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "read body: "+err.Error(), http.StatusInternalServerError)
		return
	}
	q := r.URL.Query()
	if d, err := time.ParseDuration(q.Get("sleep")); err == nil {
		time.Sleep(d)
	}
	if q.Get("hold") == "1" {
		select {
		case <-a.release:
		case <-time.After(10 * time.Second):
		}
	}
	if q.Get("panic") == "1" {
		panic("adaptertest: handler panic")
	}
	status := http.StatusCreated
	if s, err := strconv.Atoi(q.Get("status")); err == nil {
		status = s
	}
	h := w.Header()
	h.Set("Location", fmt.Sprintf("/things/%d", n))
	h.Set("Set-Cookie", "session=secret")
	h.Add("X-Multi", "a, b")
	h.Add("X-Multi", "c")
	if q.Get("override") == "1" {
		h.Set("X-Outer", "handler")
	}
	if size, err := strconv.Atoi(q.Get("bytes")); err == nil {
		h.Set("Content-Type", "application/octet-stream")
		w.WriteHeader(status)
		_, _ = w.Write(Pattern(size))
		return
	}
	sum := sha256.Sum256(body)
	h.Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if q.Get("stream") == "1" {
		fmt.Fprintf(w, `{"execution":%d,`, n)
		_ = http.NewResponseController(w).Flush()
		select {
		case <-a.release:
		case <-time.After(10 * time.Second):
		}
		fmt.Fprintf(w, `"body_sha256":%q}`, hex.EncodeToString(sum[:]))
		return
	}
	fmt.Fprintf(w, `{"execution":%d,"body_sha256":%q}`, n, hex.EncodeToString(sum[:]))
	if q.Get("panicafter") == "1" {
		_ = http.NewResponseController(w).Flush()
		panic("adaptertest: panic after the response was sent")
	}
}

// Pattern returns n bytes where byte i = i mod 251.
func Pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i % 251)
	}
	return b
}

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func itoa(n int) string { return strconv.Itoa(n) }
