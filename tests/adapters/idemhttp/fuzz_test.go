package idemhttp_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/idemkit/idem/adapters/idemhttp"
	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/memstore"
)

// fuzzBodyLimit is the engine's request body limit in FuzzHTTP, small so
// that random bodies cross it often.
const fuzzBodyLimit = 64

var (
	fuzzMethods  = []string{http.MethodPost, http.MethodPatch, http.MethodPut, http.MethodGet, http.MethodDelete, "post", "BREW"}
	fuzzStatuses = []int{200, 201, 202, 204, 400, 404, 409, 422, 429}
)

// FuzzHTTP sends random requests through the whole net/http path (adapter,
// engine, memstore) to a handler that answers only 2xx and 4xx, twice with
// the same input, once more with another principal, and once with another
// body. It asserts:
//   - no panic, and never a 5xx (idem has no reason to answer one here);
//   - a covered method (POST, PATCH, PUT here) with a missing or malformed
//     key is answered 400 and a body over the limit 413, with no execution;
//   - the handler gets the request body unchanged;
//   - the duplicate of a stored response is replayed byte-identical (status,
//     header lines except Set-Cookie, body) with Idempotent-Replayed: true
//     and no execution; a released one (409, 429) executes again;
//   - the same key from another principal executes on its own;
//   - the same key with another body is answered 422 without execution.
func FuzzHTTP(f *testing.F) {
	f.Add(byte(0), byte(1), "k1", "", "", "application/json", []byte(`{"amount":1}`), byte(1))
	f.Add(byte(0), byte(1), `"k1"`, "", "", "text/plain", []byte("x"), byte(0))
	f.Add(byte(1), byte(2), "k1", `"k1"`, "", "", []byte{}, byte(3))
	f.Add(byte(0), byte(2), "k1", "k2", "", "", []byte("a"), byte(1))
	f.Add(byte(0), byte(1), "k1, k1", "", "", "", []byte("a"), byte(4))
	f.Add(byte(0), byte(0), "", "", "", "", []byte("a"), byte(1))
	f.Add(byte(0), byte(1), "", "", "", "", []byte("a"), byte(1))
	f.Add(byte(0), byte(1), strings.Repeat("k", 256), "", "", "", []byte("a"), byte(1))
	f.Add(byte(0), byte(1), "k\x00y", "", "", "", []byte("a"), byte(1))
	f.Add(byte(0), byte(1), "k\r\nSet-Cookie: x=1", "", "", "", []byte("a"), byte(1))
	f.Add(byte(0), byte(1), "\"unterminated", "", "", "", []byte("a"), byte(1))
	f.Add(byte(0), byte(3), "k", "k", "k", "a\x00b", bytes.Repeat([]byte("b"), fuzzBodyLimit), byte(1))
	f.Add(byte(0), byte(1), "k", "", "", "", bytes.Repeat([]byte("b"), fuzzBodyLimit+1), byte(1))
	f.Add(byte(2), byte(1), "k", "", "", "", []byte("put"), byte(6))
	f.Add(byte(3), byte(0), "", "", "", "", []byte("get"), byte(8))
	f.Add(byte(5), byte(1), "k", "", "", "", []byte("lower-case post"), byte(1))
	f.Add(byte(0), byte(1), "\xff\xfe", "", "", "\xff", []byte{0, 1, 2}, byte(2))

	f.Fuzz(func(t *testing.T, mi, nkeys byte, k1, k2, k3, ctype string, body []byte, si byte) {
		method := fuzzMethods[int(mi)%len(fuzzMethods)]
		keys := []string{k1, k2, k3}[:int(nkeys)%4]
		status := fuzzStatuses[int(si)%len(fuzzStatuses)]

		store := memstore.New(memstore.WithCleanupInterval(0))
		e, err := idem.New(store, idem.WithMaxBodyBytes(fuzzBodyLimit), idem.WithMethods(http.MethodPut))
		if err != nil {
			t.Fatal(err)
		}
		executions := 0
		app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			executions++
			got, err := io.ReadAll(r.Body)
			if err != nil {
				t.Errorf("handler: reading the body: %v", err)
			}
			if !bytes.Equal(got, body) {
				t.Errorf("handler got body %q, client sent %q", got, body)
			}
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Header().Add("X-Multi", "a")
			w.Header().Add("X-Multi", "b")
			w.Header().Set("Set-Cookie", "session=secret")
			w.Header()["X-Raw"] = []string{string(body[:min(len(body), 8)])}
			w.WriteHeader(status)
			if status != http.StatusNoContent {
				_, _ = w.Write([]byte("executed:"))
				_, _ = w.Write(body)
			}
		})
		h := idemhttp.New(e, idemhttp.WithScope(func(r *http.Request) string { return r.Header.Get("X-Principal") }))(app)
		send := func(principal string, body []byte) *httptest.ResponseRecorder {
			r := httptest.NewRequest(http.MethodPost, "/v1/payments?q=1", bytes.NewReader(body))
			r.Method = method
			r.Header["Content-Type"] = []string{ctype}
			if len(keys) > 0 {
				r.Header["Idempotency-Key"] = slices.Clone(keys)
			}
			r.Header.Set("X-Principal", principal)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code >= 500 {
				t.Fatalf("%s with keys %q: status %d: %s", method, keys, w.Code, w.Body.Bytes())
			}
			return w
		}

		covered := e.Covers(method)
		_, keyErr := idem.ParseKey(keys)
		first := send("alice", body)
		switch {
		case !covered:
			if executions != 1 || first.Code != status {
				t.Fatalf("uncovered %s: executions %d, status %d; want 1, %d", method, executions, first.Code, status)
			}
			return
		case keyErr != nil:
			if executions != 0 || first.Code != http.StatusBadRequest {
				t.Fatalf("%s with keys %q (%v): executions %d, status %d; want 0, 400", method, keys, keyErr, executions, first.Code)
			}
			return
		case len(body) > fuzzBodyLimit:
			if executions != 0 || first.Code != http.StatusRequestEntityTooLarge {
				t.Fatalf("body of %d bytes (limit %d): executions %d, status %d; want 0, 413", len(body), fuzzBodyLimit, executions, first.Code)
			}
			return
		}
		if executions != 1 || first.Code != status {
			t.Fatalf("valid %s with keys %q: executions %d, status %d; want 1, %d", method, keys, executions, first.Code, status)
		}

		second := send("alice", body)
		stored := status != http.StatusConflict && status != http.StatusTooManyRequests
		if !stored {
			if executions != 2 || second.Code != status {
				t.Fatalf("retry after a released %d: executions %d, status %d; want 2, %d", status, executions, second.Code, status)
			}
			return
		}
		if executions != 1 {
			t.Fatalf("duplicate of a stored %d executed again (executions %d)", status, executions)
		}
		if second.Code != first.Code || !bytes.Equal(second.Body.Bytes(), first.Body.Bytes()) {
			t.Fatalf("replay = %d %q, first = %d %q", second.Code, second.Body.Bytes(), first.Code, first.Body.Bytes())
		}
		want := first.Header().Clone()
		delete(want, "Set-Cookie")
		want[idem.ReplayedHeader] = []string{"true"}
		if first.Code != http.StatusNoContent && first.Code != http.StatusNotModified {
			want["Content-Length"] = []string{strconv.Itoa(first.Body.Len())} // replays state it; the recorder never sets it
		}
		if got := second.Header(); !headersEqual(got, want) {
			t.Fatalf("replayed header %q, want %q", got, want)
		}

		other := send("bob", body)
		if executions != 2 || other.Code != status || other.Header().Get(idem.ReplayedHeader) != "" {
			t.Fatalf("same key, other principal: executions %d, status %d, replayed %q; want 2, %d, not replayed",
				executions, other.Code, other.Header().Get(idem.ReplayedHeader), status)
		}

		changed := append(slices.Clone(body), 'x')
		if len(changed) <= fuzzBodyLimit {
			if w := send("alice", changed); executions != 2 || w.Code != http.StatusUnprocessableEntity {
				t.Fatalf("same key, other body: executions %d, status %d; want 2, 422", executions, w.Code)
			}
		}
	})
}

func headersEqual(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}
