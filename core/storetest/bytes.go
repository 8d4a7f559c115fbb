package storetest

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	idem "github.com/idemkit/idem/core"
)

// testAcquiredBytesUnchanged: the bytes Acquire hands out, which the
// engine replays from in place, never change afterwards: not when other
// records complete and are read, nor when the record expires and its key
// completes again with other bytes.
func testAcquiredBytesUnchanged(t *testing.T, s idem.Store) {
	var key string
	var handed []byte
	timely(t, func() bool {
		key = Key()
		tok, fp := Token(), fingerprint("a")
		mustAcquire(t, s, key, tok, fp, longLease)
		start := time.Now()
		mustComplete(t, s, key, tok, sampleResponse(), shortLease)
		rec, acquired, err := s.Acquire(ctx(t), key, Token(), fp, longLease)
		if err != nil {
			t.Fatal(err)
		}
		if acquired {
			if time.Since(start) < shortLease {
				t.Fatal("Acquire took over a completed record before its retention ended")
			}
			return false
		}
		handed = rec.Response
		return true
	})
	before := slices.Clone(handed)
	equalResponse(t, handed, sampleResponse())
	key2, tok2, fp := Key(), Token(), fingerprint("a")
	mustAcquire(t, s, key2, tok2, fp, longLease)
	mustComplete(t, s, key2, tok2, []byte("another response"), retention)
	if rec2, _, err := s.Acquire(ctx(t), key2, Token(), fp, longLease); err != nil || string(rec2.Response) != "another response" {
		t.Fatalf("Acquire of a second completed record = %+v, %v", rec2, err)
	}
	time.Sleep(shortLease + 200*time.Millisecond)
	tok3 := Token()
	mustAcquire(t, s, key, tok3, fp, longLease)
	mustComplete(t, s, key, tok3, bytes.Repeat([]byte{0xee}, len(before)), retention)
	if rec3, _, err := s.Acquire(ctx(t), key, Token(), fp, longLease); err != nil || rec3.Response[0] != 0xee {
		t.Fatalf("Acquire after the key completed again = %+v, %v", rec3, err)
	}
	if !bytes.Equal(handed, before) {
		t.Fatal("bytes Acquire handed out changed afterwards")
	}
}

// testCompleteThroughEngine completes records through an engine, from an
// http.Header ([idem.Execution.Finish]) and from lines
// ([idem.Execution.FinishLines], as the Fiber adapters do), and replays
// them: repeated names apart from each other (their values in order),
// empty and non-UTF-8 values, a binary body, and more lines than
// [idem.HeaderLines] holds. Get's bytes decode ([idem.DecodeResponse]) to
// the same response.
func testCompleteThroughEngine(t *testing.T, s idem.Store) {
	e, err := idem.New(s, idem.WithGlobalScope(), idem.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.Close(ctx(t)) }()
	sampleLines := [][2]string{{"Content-Type", "application/json"}, {"Location", "/v1/payments/pay_1"}, {"Link", `<a>; rel="x"`}, {"Link", `<c>; rel="z"`}}
	mixed := [][2]string{{"X-A", "1"}, {"X-B", ""}, {"X-A", "\x00\xff not UTF-8"}, {"Location", "/v1/payments/pay_2"}, {"X-B", "é"}, {"X-A", "3"}}
	many := slices.Clone(mixed)
	for i := range 40 {
		many = append(many, [2]string{"X-Pad", strings.Repeat(strconv.Itoa(i), 60)})
	}
	for _, tc := range []struct {
		name  string
		lines [][2]string
		body  []byte
	}{
		{"sample", sampleLines, []byte(`{"id":"pay_1"}`)},
		{"mixed", mixed, []byte{0, 0xff, '\n', 0}},
		{"past HeaderLines", many, bytes.Repeat([]byte{0xfe, 0}, 3000)},
	} {
		for _, finish := range []string{"Finish", "FinishLines"} {
			t.Run(tc.name+"/"+finish, func(t *testing.T) {
				req := &idem.Request{Method: http.MethodPost, Path: "/v1/payments", Keys: []string{Key()}, Body: []byte(`{"amount":1}`)}
				x, resp := e.Begin(ctx(t), req)
				if x == nil {
					t.Fatalf("Begin of a new key = %+v; want an execution", resp)
				}
				want := http.Header{}
				var lines idem.HeaderLines
				for _, l := range tc.lines {
					lines.Add([]byte(l[0]), []byte(l[1]))
					want.Add(l[0], l[1])
				}
				if finish == "Finish" {
					_, _ = x.Write(tc.body)
					x.Finish(http.StatusCreated, want.Clone())
				} else {
					x.FinishLines(http.StatusCreated, &lines, tc.body)
				}
				_, resp = e.Begin(ctx(t), req)
				if resp == nil || !resp.IsReplay() {
					t.Fatalf("retry = %+v; want a replay", resp)
				}
				w := httptest.NewRecorder()
				resp.Send(w)
				got := w.Header()
				delete(got, idem.ReplayedHeader)
				delete(got, "Content-Length")
				if w.Code != http.StatusCreated || !reflect.DeepEqual(got, want) || !bytes.Equal(w.Body.Bytes(), tc.body) {
					t.Fatalf("replay = %d %v %q; want 201 %v %q", w.Code, got, trunc(w.Body.Bytes()), want, trunc(tc.body))
				}
				rec, _ := get(t, s, idem.ScopedKey("", http.MethodPost, "/v1/payments", req.Keys[0]))
				dec, err := idem.DecodeResponse(rec.Response)
				if err != nil || dec.Status != http.StatusCreated || !reflect.DeepEqual(dec.Header, want) || !bytes.Equal(dec.Body, tc.body) {
					t.Fatalf("Get's response decodes to %+v, %v; want 201 %v", dec, err, want)
				}
			})
		}
	}
}
