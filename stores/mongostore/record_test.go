package mongostore

import (
	"bytes"
	"net/http"
	"reflect"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	idem "github.com/idemkit/idem/core"
)

// FuzzRecordRoundTrip converts a Response into the stored document, through
// BSON bytes and back, without a server: every byte of the body and of the
// header values (NUL, invalid UTF-8) must come back, and decoding arbitrary
// stored bytes must fail cleanly, never panic.
func FuzzRecordRoundTrip(f *testing.F) {
	f.Add(201, "Content-Type", "application/json", "", []byte(`{"id":"pay_1"}`))
	f.Add(200, "X-Odd", "\x01ü\xff", "a, b", []byte{0, 0, 0xff, 0xfe, 0xc3})
	f.Add(204, "", "", "", []byte{})
	f.Add(999, "Link", `<a>; rel="x"`, "\x00", []byte("\x00"))
	f.Fuzz(func(t *testing.T, status int, name, v1, v2 string, body []byte) {
		status = 100 + (status%900+900)%900 // 100..999, the codec's range
		want := &idem.Response{Status: status, Header: http.Header{}, Body: body}
		if name != "" {
			want.Header[name] = []string{v1, v2}
		}
		enc, err := encodeResponse(want)
		if err != nil {
			t.Fatal(err)
		}
		in := record{ID: "k", State: stateCompleted, Token: "t", Fingerprint: "fp",
			ExpiresAt: bson.NewDateTimeFromTime(time.UnixMilli(1700000000000)), Response: enc}
		b, err := bson.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		var out record
		if err := bson.Unmarshal(b, &out); err != nil {
			t.Fatal(err)
		}
		if out.ExpiresAt != in.ExpiresAt || out.Fingerprint != "fp" || out.Token != "t" || out.ID != "k" {
			t.Fatalf("record fields changed: %+v", out)
		}
		rec, err := out.toRecord()
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		got := rec.Response
		if rec.State != idem.StateCompleted || got.Status != status || !bytes.Equal(got.Body, body) {
			t.Fatalf("round trip = %v %d %q; want completed %d %q", rec.State, got.Status, got.Body, status, body)
		}
		if len(got.Header) != len(want.Header) || (len(want.Header) > 0 && !reflect.DeepEqual(got.Header, want.Header)) {
			t.Fatalf("header = %q; want %q", got.Header, want.Header)
		}

		// Arbitrary stored bytes: an error or a response, never a panic.
		junk := record{ID: "k", State: stateCompleted, Response: body}
		_, _ = junk.toRecord()
	})
}

func TestRecordStates(t *testing.T) {
	rec, err := (&record{State: stateInProgress, Token: "t", Fingerprint: "fp"}).toRecord()
	if err != nil || rec.State != idem.StateInProgress || rec.Token != "t" || rec.Fingerprint != "fp" || rec.Response != nil {
		t.Fatalf("in-progress record = %+v, %v", rec, err)
	}
	for _, st := range []int32{0, 3, -1} {
		if _, err := (&record{State: st}).toRecord(); err == nil {
			t.Fatalf("state %d decoded without error", st)
		}
	}
	if _, err := (&record{State: stateCompleted}).toRecord(); err == nil {
		t.Fatal("completed record without a response decoded without error")
	}
	if _, err := encodeResponse(nil); err == nil {
		t.Fatal("encodeResponse(nil) = nil error")
	}
}
