package memstore_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/stores/memstore"
)

// TestTombstoneMemory measures the heap a record takes while completed
// (a 200-byte response) and once only its tombstone is kept
// ([idem.Keep.Tombstone]), over 20,000 records: Cleanup must free the
// responses at the end of the retention. The numbers are the memstore
// README's.
func TestTombstoneMemory(t *testing.T) {
	const n = 20_000
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	s := memstore.New(memstore.WithCleanupInterval(0), memstore.WithClock(func() time.Time { return time.Unix(0, now.Load()) }))
	ctx := context.Background()
	resp := make([]byte, 200)
	heap := func() int64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return int64(m.HeapAlloc)
	}
	keys := make([]string, n)
	for i := range keys {
		keys[i] = storetest.Key()
	}
	fp := fmt.Sprintf("%064x", 7)
	before := heap()
	for _, k := range keys {
		if _, ok, err := s.AcquireKeep(ctx, k, "tok."+k[:8], fp, time.Minute, idem.Keep{Tombstone: 24 * time.Hour}); err != nil || !ok {
			t.Fatal(ok, err)
		}
		if err := s.Complete(ctx, k, "tok."+k[:8], resp, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	completed := (heap() - before) / n
	now.Add(int64(2 * time.Hour)) // past the retention, inside the tombstone
	s.Cleanup()
	tomb := (heap() - before) / n
	rec, _, err := s.Get(ctx, keys[0])
	if err != nil || rec.State != idem.StateExpired || rec.Response != nil {
		t.Fatalf("Get after the retention = %+v, %v; want a tombstone", rec, err)
	}
	t.Logf("heap per record (map slot and entry; the key's and fingerprint's 64-byte strings are the caller's): completed with a 200-byte response %d B, tombstone %d B", completed, tomb)
	if tomb > completed-150 {
		t.Fatalf("a tombstone takes %d B against %d B completed: its response was not freed", tomb, completed)
	}
	runtime.KeepAlive(keys)
}
