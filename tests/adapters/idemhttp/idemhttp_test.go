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
		Mount:  mount,
		Native: native,
		NewStore: func(t *testing.T) idem.Store {
			s := memstore.New()
			t.Cleanup(func() { s.Close() })
			return s
		},
	})
}

// native serves one of the suite's native cases written as plain net/http
// handlers: net/http has no error type, so both errors are http.Error.
func native(t *testing.T, m adaptertest.NativeMount) string {
	var h http.HandlerFunc
	switch m.Case {
	case adaptertest.HandlerError:
		h = func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "card declined", http.StatusPaymentRequired)
		}
	case adaptertest.PlainError:
		h = func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "database gone", http.StatusInternalServerError)
		}
	case adaptertest.Panic:
		h = func(http.ResponseWriter, *http.Request) { panic("boom") }
	case adaptertest.PanicAfterWrite:
		h = func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte("written"))
			_ = http.NewResponseController(w).Flush()
			panic("boom")
		}
	case adaptertest.HeaderLines:
		h = func(w http.ResponseWriter, _ *http.Request) {
			hd := w.Header()
			for _, l := range m.Lines {
				hd.Add(l[0], l[1])
			}
			hd.Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte("body"))
		}
	case adaptertest.Stream:
		h = func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("Location", "/streams/1")
			w.WriteHeader(http.StatusOK)
			for i := 1; i <= 3; i++ {
				if i == 2 {
					<-m.Release
				}
				fmt.Fprintf(w, "data: %d\n\n", i)
				_ = http.NewResponseController(w).Flush()
			}
		}
	case adaptertest.HangUp:
		h = func(w http.ResponseWriter, r *http.Request) {
			<-r.Context().Done()
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte("done after hang-up"))
		}
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.Executed(); h(w, r) })
	mw := idemhttp.New(m.Engine, idemhttp.WithScope(func(r *http.Request) string { return r.Header.Get(adaptertest.PrincipalHeader) }))
	var chain http.Handler
	if m.RecoveryInside {
		chain = mw(recoverer(handler))
	} else {
		chain = recoverer(mw(handler))
	}
	mux := http.NewServeMux()
	mux.Handle("POST /x", chain)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header()["x-request-id"] = []string{r.Header.Get("X-Request-Id")}
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/x"
}
