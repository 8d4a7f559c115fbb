package storetest

import (
	"bytes"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	idem "github.com/idemkit/idem/core"
)

// testEncodedRecords checks a store whose Acquire hands completed
// responses out encoded ([idem.Record.Encoded]): Response is nil then, the
// bytes decode to what was stored, and they never change afterwards, when
// other records are completed and read.
func testEncodedRecords(t *testing.T, s idem.Store) {
	key, tok, fp := Key(), Token(), fingerprint("a")
	mustAcquire(t, s, key, tok, fp, longLease)
	mustComplete(t, s, key, tok, sampleResponse(), retention)
	rec, acquired, err := s.Acquire(ctx(t), key, Token(), fp, longLease)
	if err != nil || acquired {
		t.Fatalf("Acquire on completed = %v, %v", acquired, err)
	}
	if rec.Encoded == nil {
		t.Skip("the store's Acquire returns decoded responses")
	}
	if rec.Response != nil {
		t.Fatalf("Acquire returned both Response and Encoded: %+v", rec)
	}
	equalResponse(t, completedResponse(t, rec), sampleResponse())
	before := string(rec.Encoded)
	key2, tok2 := Key(), Token()
	mustAcquire(t, s, key2, tok2, fp, longLease)
	mustComplete(t, s, key2, tok2, &idem.Response{Status: 500, Body: []byte("another response")}, retention)
	if rec2, _, err := s.Acquire(ctx(t), key2, Token(), fp, longLease); err != nil || completedResponse(t, rec2).Status != 500 {
		t.Fatalf("Acquire of a second completed record = %+v, %v", rec2, err)
	}
	if string(rec.Encoded) != before {
		t.Fatal("the encoding handed out changed when another record was completed and read")
	}
}

// testCompleteFromLines completes records through an engine whose adapter
// hands the response over as lines ([idem.Execution.FinishLines], as the
// Fiber adapters do): the store receives a Response with a nil Header,
// readable only through EachHeader and AppendBinary, and must store its
// lines all the same: repeated names apart from each other (their values in
// order), empty and non-UTF-8 values, a binary body, and more lines than
// [idem.HeaderLines] holds (the engine then hands over a Header).
func testCompleteFromLines(t *testing.T, s idem.Store) {
	e, err := idem.New(s, idem.WithGlobalScope(), idem.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.Close(ctx(t)) }()
	sample := sampleResponse()
	var sampleLines [][2]string
	for k, vs := range sample.Header {
		for _, v := range vs {
			sampleLines = append(sampleLines, [2]string{k, v})
		}
	}
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
		{"sample", sampleLines, sample.Body},
		{"mixed", mixed, []byte{0, 0xff, '\n', 0}},
		{"past HeaderLines", many, bytes.Repeat([]byte{0xfe, 0}, 3000)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := &idem.Request{Method: http.MethodPost, Path: "/v1/payments", Keys: []string{Key()}, Body: []byte(`{"amount":1}`)}
			x, resp := e.Begin(ctx(t), req)
			if x == nil {
				t.Fatalf("Begin of a new key = %+v; want an execution", resp)
			}
			want := &idem.Response{Status: http.StatusCreated, Header: http.Header{}, Body: tc.body}
			var lines idem.HeaderLines
			for _, l := range tc.lines {
				lines.Add([]byte(l[0]), []byte(l[1]))
				want.Header.Add(l[0], l[1])
			}
			x.FinishLines(want.Status, &lines, want.Body)
			_, resp = e.Begin(ctx(t), req)
			if resp == nil || !resp.IsReplay() {
				t.Fatalf("retry = %+v; want a replay", resp)
			}
			got := resp.Clone()
			delete(got.Header, idem.ReplayedHeader)
			equalResponse(t, got, want)
		})
	}
}
