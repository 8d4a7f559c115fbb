package mongostore_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/stores/mongostore"
)

func benchStore(b *testing.B) *mongostore.Store {
	c, _ := shared(b) // skips without IDEM_MONGO_URI unless CI=true
	return mongostore.New(collection(b, c))
}

// benchResponse is the engine's encoding of a 201 with Content-Type,
// Location and a 65-byte JSON body.
var benchResponse = []byte("\x01\xc9\x01\x02\x0cContent-Type\x01\x10application/json\x08Location\x01\x12/v1/payments/pay_1" +
	`{"id":"pay_1","amount":100,"currency":"eur","status":"succeeded"}`)

// BenchmarkAcquireComplete measures a first execution: Acquire then Complete
// (2 round trips).
func BenchmarkAcquireComplete(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		key, tok := storetest.Key(), storetest.Token()
		if _, ok, err := s.Acquire(ctx, key, tok, "fp", time.Minute); err != nil || !ok {
			b.Fatalf("Acquire = %v, %v", ok, err)
		}
		if err := s.Complete(ctx, key, tok, benchResponse, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReplay measures a duplicate of a completed request: one Acquire
// returning the stored response (1 round trip).
func BenchmarkReplay(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	key, tok := storetest.Key(), storetest.Token()
	if _, ok, err := s.Acquire(ctx, key, tok, "fp", time.Minute); err != nil || !ok {
		b.Fatalf("Acquire = %v, %v", ok, err)
	}
	if err := s.Complete(ctx, key, tok, benchResponse, time.Hour); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		rec, ok, err := s.Acquire(ctx, key, storetest.Token(), "fp", time.Minute)
		if err != nil || ok || rec.Response == nil {
			b.Fatalf("replay Acquire = %+v, %v, %v", rec, ok, err)
		}
	}
}
