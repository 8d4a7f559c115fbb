// Package floor is the reference floor the benchmarks pair idem with on
// net/http and Gin: the least work a correct in-process idempotency
// middleware does. The raw Idempotency-Key is looked up in a sharded map;
// a request whose key is in progress gets 409; the first request's status,
// Content-Type and body are stored and replayed. No scope, no fingerprint,
// no lease, no store interface, no key syntax check, no retention: every
// one of those is work idem does and the floor does not, so idem ÷ floor
// bounds what any peer configured like idem could win. Not for production.
package floor

import (
	"bytes"
	"hash/maphash"
	"net/http"
	"sync"

	"github.com/gin-gonic/gin"
)

// Header is the request header holding the idempotency key.
const Header = "Idempotency-Key"

// Store is the floor's record map: 64 shards of a mutex and a map. Records
// are never removed.
type Store struct {
	seed   maphash.Seed
	shards [64]struct {
		mu sync.Mutex
		m  map[string]*record
	}
}

// record is one key's record: in progress until done.
type record struct {
	done   bool
	status int
	ctype  string
	body   []byte
}

// New returns an empty Store.
func New() *Store {
	s := &Store{seed: maphash.MakeSeed()}
	for i := range s.shards {
		s.shards[i].m = make(map[string]*record)
	}
	return s
}

// begin returns the completed record of key, or claims key (claimed true),
// or reports it in progress (nil, false).
func (s *Store) begin(key string) (rec record, claimed, inProgress bool) {
	sh := &s.shards[maphash.String(s.seed, key)%uint64(len(s.shards))]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	r, ok := sh.m[key]
	switch {
	case !ok:
		sh.m[key] = &record{}
		return record{}, true, false
	case !r.done:
		return record{}, false, true
	}
	return *r, false, false
}

func (s *Store) finish(key string, status int, ctype string, body []byte) {
	sh := &s.shards[maphash.String(s.seed, key)%uint64(len(s.shards))]
	sh.mu.Lock()
	sh.m[key] = &record{done: true, status: status, ctype: ctype, body: bytes.Clone(body)}
	sh.mu.Unlock()
}

// capture records what the handler writes while passing it on.
type capture struct {
	http.ResponseWriter
	status int
	body   bytes.Buffer
}

func (c *capture) WriteHeader(code int) {
	if c.status == 0 {
		c.status = code
	}
	c.ResponseWriter.WriteHeader(code)
}

func (c *capture) Write(b []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	c.body.Write(b)
	return c.ResponseWriter.Write(b)
}

// HTTP is the floor as net/http middleware storing in s.
func HTTP(s *Store) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			key := r.Header.Get(Header)
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
			c := &capture{ResponseWriter: w}
			next.ServeHTTP(c, r)
			s.finish(key, c.status, w.Header().Get("Content-Type"), c.body.Bytes())
		})
	}
}

// ginWriter records what a Gin handler writes.
type ginWriter struct {
	gin.ResponseWriter
	body bytes.Buffer
}

func (w *ginWriter) Write(b []byte) (int, error) {
	w.body.Write(b)
	return w.ResponseWriter.Write(b)
}

func (w *ginWriter) WriteString(s string) (int, error) {
	w.body.WriteString(s)
	return w.ResponseWriter.WriteString(s)
}

// Gin is the floor as Gin middleware storing in s.
func Gin(s *Store) gin.HandlerFunc {
	return func(c *gin.Context) {
		key := c.GetHeader(Header)
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
		w := &ginWriter{ResponseWriter: c.Writer}
		c.Writer = w
		c.Next()
		s.finish(key, w.Status(), w.Header().Get("Content-Type"), w.body.Bytes())
	}
}
