package benchmarks

import (
	"bytes"
	"hash/maphash"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	idem "github.com/idemkit/idem/core"
)

// The Go libraries named in issue #27 (github.com/fco-gt/gopotency,
// github.com/bright-room/idem, github.com/repenguin22/idemlease) are not
// served by the module proxy this repository builds from (every version:
// 403 "not available"), so they cannot be measured here. On Gin and
// net/http idem is paired instead with floor, the least work a correct
// in-process idempotency middleware does: the raw key looked up in a
// sharded map, 409 while the first request runs, status, Content-Type and
// body stored and replayed. No scope, no fingerprint, no lease, no store
// interface, no key syntax check: every one of those is work idem does and
// the floor does not, so idem ÷ floor is an upper bound of what any peer
// configured like idem could win.

// floorStore is the floor's record map: 64 shards of a mutex and a map.
type floorStore struct {
	seed   maphash.Seed
	shards [64]struct {
		mu sync.Mutex
		m  map[string]*floorRecord
	}
}

// floorRecord is one key's record: in progress until done.
type floorRecord struct {
	done   bool
	status int
	ctype  string
	body   []byte
}

func newFloorStore() *floorStore {
	s := &floorStore{seed: maphash.MakeSeed()}
	for i := range s.shards {
		s.shards[i].m = make(map[string]*floorRecord)
	}
	return s
}

// begin returns the completed record of key, or claims key (claimed true),
// or reports it in progress (nil, false).
func (s *floorStore) begin(key string) (rec floorRecord, claimed, inProgress bool) {
	sh := &s.shards[maphash.String(s.seed, key)%uint64(len(s.shards))]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	r, ok := sh.m[key]
	switch {
	case !ok:
		sh.m[key] = &floorRecord{}
		return floorRecord{}, true, false
	case !r.done:
		return floorRecord{}, false, true
	}
	return *r, false, false
}

func (s *floorStore) finish(key string, status int, ctype string, body []byte) {
	sh := &s.shards[maphash.String(s.seed, key)%uint64(len(s.shards))]
	sh.mu.Lock()
	sh.m[key] = &floorRecord{done: true, status: status, ctype: ctype, body: bytes.Clone(body)}
	sh.mu.Unlock()
}

// floorCapture records what the handler writes while passing it on.
type floorCapture struct {
	http.ResponseWriter
	status int
	body   bytes.Buffer
}

func (c *floorCapture) WriteHeader(code int) {
	if c.status == 0 {
		c.status = code
	}
	c.ResponseWriter.WriteHeader(code)
}

func (c *floorCapture) Write(b []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	c.body.Write(b)
	return c.ResponseWriter.Write(b)
}

// floorHTTP is the floor as net/http middleware.
func floorHTTP(s *floorStore) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			key := r.Header.Get(idem.DefaultHeader)
			if key == "" {
				next.ServeHTTP(w, r)
				return
			}
			rec, claimed, inProgress := s.begin(key)
			switch {
			case inProgress:
				w.WriteHeader(http.StatusConflict)
				return
			case !claimed:
				w.Header().Set("Content-Type", rec.ctype)
				w.WriteHeader(rec.status)
				_, _ = w.Write(rec.body)
				return
			}
			c := &floorCapture{ResponseWriter: w}
			next.ServeHTTP(c, r)
			s.finish(key, c.status, w.Header().Get("Content-Type"), c.body.Bytes())
		})
	}
}

// floorGinWriter records what a Gin handler writes.
type floorGinWriter struct {
	gin.ResponseWriter
	body bytes.Buffer
}

func (w *floorGinWriter) Write(b []byte) (int, error) {
	w.body.Write(b)
	return w.ResponseWriter.Write(b)
}

func (w *floorGinWriter) WriteString(s string) (int, error) {
	w.body.WriteString(s)
	return w.ResponseWriter.WriteString(s)
}

// floorGin is the floor as Gin middleware.
func floorGin(s *floorStore) gin.HandlerFunc {
	return func(c *gin.Context) {
		key := c.GetHeader(idem.DefaultHeader)
		if key == "" {
			c.Next()
			return
		}
		rec, claimed, inProgress := s.begin(key)
		switch {
		case inProgress:
			c.AbortWithStatus(http.StatusConflict)
			return
		case !claimed:
			c.Data(rec.status, rec.ctype, rec.body)
			c.Abort()
			return
		}
		w := &floorGinWriter{ResponseWriter: c.Writer}
		c.Writer = w
		c.Next()
		s.finish(key, w.Status(), w.Header().Get("Content-Type"), w.body.Bytes())
	}
}

// newNetHTTPFloor and newGinFloor are the apps of BenchmarkMiddleware on
// net/http and Gin with the floor instead of idem.
func newNetHTTPFloor() driver {
	h := floorHTTP(newFloorStore())(http.HandlerFunc(handleHTTP))
	mux := http.NewServeMux()
	mux.Handle("POST "+route, h)
	mux.Handle("GET "+route, h)
	return newHTTPDriver(mux)
}

func newGinFloor() driver {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Use(floorGin(newFloorStore()))
	r.POST(route, ginHandler)
	r.GET(route, ginHandler)
	return newHTTPDriver(r)
}

// BenchmarkNetHTTPPeer pairs idem on net/http (memory store) with the
// floor middleware, fresh and replay, in alternating chunks of 500 requests
// as BenchmarkFiberPeer does: the ratio idem/builtin is idem ÷ floor.
func BenchmarkNetHTTPPeer(b *testing.B) { benchPeer(b, "nethttp", newNetHTTPFloor) }

// BenchmarkGinPeer pairs idem on Gin (memory store) with the floor, as
// BenchmarkNetHTTPPeer does on net/http.
func BenchmarkGinPeer(b *testing.B) { benchPeer(b, "gin", newGinFloor) }

// keyCounts, when set, counts the handlers' executions per idempotency key
// (TestPeersExecutions); execDelay makes each counted execution last long
// enough for concurrent duplicates to overlap it.
var (
	keyCounts atomic.Pointer[sync.Map] // key -> *atomic.Int64
	execDelay = 2 * time.Millisecond
)

// countKey records one execution of key when keyCounts is set.
func countKey(key string) {
	m := keyCounts.Load()
	if m == nil {
		return
	}
	v, ok := m.Load(key)
	if !ok { // fasthttp's strings alias its buffers: the map keeps a copy
		v, _ = m.LoadOrStore(strings.Clone(key), new(atomic.Int64))
	}
	v.(*atomic.Int64).Add(1)
	time.Sleep(execDelay)
}
