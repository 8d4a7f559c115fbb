package mongostore

import (
	"bytes"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	idem "github.com/idemkit/idem/core"
)

// FuzzRecordRoundTrip converts a response into the stored document, through
// BSON bytes and back, without a server: every byte (NUL, invalid UTF-8)
// must come back unchanged, and a record that does not convert must fail
// cleanly, never panic.
func FuzzRecordRoundTrip(f *testing.F) {
	f.Add([]byte("\x01\xc9\x01\x01\x0cContent-Type\x01\x10application/json{\"id\":\"pay_1\"}"))
	f.Add([]byte{0, 0, 0xff, 0xfe, 0xc3})
	f.Add([]byte{0})
	f.Fuzz(func(t *testing.T, response []byte) {
		in := record{ID: "k", State: stateCompleted, Token: "t", Fingerprint: "fp",
			ExpiresAt: bson.NewDateTimeFromTime(time.UnixMilli(1700000000000)), Response: response}
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
		rec, err := out.toRecord(-1)
		if len(response) == 0 {
			if err == nil {
				t.Fatal("completed record without a response converted without error")
			}
			return
		}
		if err != nil || rec.State != idem.StateCompleted || !bytes.Equal(rec.Response, response) {
			t.Fatalf("round trip = %+v, %v; want completed with %q", rec, err, response)
		}
	})
}

func TestRecordStates(t *testing.T) {
	rec, err := (&record{State: stateInProgress, Token: "t", Fingerprint: "fp"}).toRecord(-1)
	if err != nil || rec.State != idem.StateInProgress || rec.Token != "t" || rec.Fingerprint != "fp" || rec.Response != nil {
		t.Fatalf("in-progress record = %+v, %v", rec, err)
	}
	for _, st := range []int32{0, 3, -1} {
		if _, err := (&record{State: st}).toRecord(-1); err == nil {
			t.Fatalf("state %d decoded without error", st)
		}
	}
	if _, err := (&record{State: stateCompleted}).toRecord(-1); err == nil {
		t.Fatal("completed record without a response decoded without error")
	}
}
