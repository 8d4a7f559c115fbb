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

func mount(t *testing.T, e *idem.Engine, app http.Handler) string {
	mw := idemhttp.New(e, idemhttp.WithScope(func(r *http.Request) string {
		return r.Header.Get(adaptertest.PrincipalHeader)
	}))
	mux := http.NewServeMux()
	mux.Handle("/a", mw(app))
	mux.Handle("/b", mw(app))
	srv := httptest.NewServer(recoverer(mux))
	t.Cleanup(srv.Close)
	return srv.URL
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
