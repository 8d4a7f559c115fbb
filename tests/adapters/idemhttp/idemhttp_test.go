package idemhttp_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemkit/idem/adapters/idemhttp"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adaptertest"
	"github.com/idemkit/idem/stores/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recoverer is the app's own recovery middleware, outside idem.
func recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if p := recover(); p != nil {
				http.Error(w, fmt.Sprint(p), http.StatusInternalServerError)
			}
		}()
		next.ServeHTTP(w, r)
	})
}

func mount(t *testing.T, m adaptertest.Mount) string {
	mw := idemhttp.New(m.Engine,
		idemhttp.WithScope(func(r *http.Request) string { return r.Header.Get(adaptertest.PrincipalHeader) }),
		idemhttp.WithSkip(func(r *http.Request) bool { return m.Skip(r.URL.Path) }))
	routes := http.NewServeMux()
	mux := routes
	switch m.Where {
	case adaptertest.PerRoute:
		for _, p := range []string{"/a", "/b", "/skipped"} {
			routes.Handle(p, mw(m.App))
		}
	case adaptertest.Group: // a sub-router under /g, idem around it
		for _, p := range []string{"/a", "/b", "/skipped"} {
			routes.Handle(p, m.App)
		}
		mux = http.NewServeMux()
		mux.Handle("/g/", http.StripPrefix("/g", mw(routes)))
	case adaptertest.Global: // idem around the whole router
		for _, p := range []string{"/a", "/b", "/skipped"} {
			routes.Handle(p, m.App)
		}
		mux = http.NewServeMux()
		mux.Handle("/", mw(routes))
	case adaptertest.Twice: // idem around the whole router and again around the sub-router /g
		for _, p := range []string{"/a", "/b", "/skipped"} {
			routes.Handle(p, m.App)
		}
		group := http.NewServeMux()
		group.Handle("/g/", http.StripPrefix("/g", mw(routes)))
		mux = http.NewServeMux()
		mux.Handle("/", mw(group))
	case adaptertest.Nested:
		for _, p := range []string{"/a", "/b", "/skipped"} {
			routes.Handle(p, mw(mw(m.App)))
		}
	}
	srv := httptest.NewServer(outer(recoverer(mux)))
	t.Cleanup(srv.Close)
	if m.Where == adaptertest.Group || m.Where == adaptertest.Twice {
		return srv.URL + "/g"
	}
	return srv.URL
}

// outer is the app's CORS and request-id middleware, outside idem.
func outer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for k, v := range adaptertest.OuterHeaders(r.Header.Get("Origin"), r.Header.Get("X-Request-Id")) {
			w.Header()[k] = v
		}
		next.ServeHTTP(w, r)
	})
}

func TestBehaviour(t *testing.T) {
	adaptertest.Run(t, adaptertest.Config{
		Mount: mount,
		NewStore: func(t *testing.T) idem.Store {
			s := memstore.New()
			t.Cleanup(func() { s.Close() })
			return s
		},
	})
}
