package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/redisstore"
)

// TestListPages walks more records than one SCAN batch holds, by pages of
// one, on one server and on a Cluster: every record is listed, pages end
// with a cursor until the scan (of every master) ends, the state filter
// holds, keys under the prefix that are not records are skipped, and the
// prefix's glob characters are matched literally.
func TestListPages(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]redis.UniversalClient{"standalone": newClient(t), "cluster": newClusterClient(t)} {
		t.Run(name, func(t *testing.T) { testListPages(t, c) })
	}
}

func testListPages(t *testing.T, c redis.UniversalClient) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	prefix := newPrefix(t, c)
	// A literal [*?] in the prefix: as a glob it would also match the
	// neighbour's keys. Both sets of keys expire with their lease.
	s := redisstore.New(c, redisstore.WithPrefix(prefix+"[*?]:"))
	neighbour := redisstore.New(c, redisstore.WithPrefix(prefix+"x:"))
	const n = 2500 // more than one SCAN batch (COUNT 1000)
	want := map[string]idem.State{}
	for i := range n {
		key := fmt.Sprintf("%064x", i)
		if _, ok, err := s.Acquire(ctx, key, "tok", "fp", time.Minute); err != nil || !ok {
			t.Fatalf("Acquire %d = %v, %v", i, ok, err)
		}
		want[key] = idem.StateInProgress
		if i%10 == 0 {
			if err := s.Complete(ctx, key, "tok", []byte("response"), time.Minute); err != nil {
				t.Fatal(err)
			}
			want[key] = idem.StateCompleted
		}
	}
	if _, _, err := neighbour.Acquire(ctx, fmt.Sprintf("%064x", 1), "tok", "fp", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := c.RPush(ctx, prefix+"[*?]:"+fmt.Sprintf("%064x", n+1), "foreign").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, prefix+"[*?]:"+fmt.Sprintf("%064x", n+2), "not a record", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}

	for _, state := range []idem.State{0, idem.StateCompleted} {
		got := map[string]idem.State{}
		q := idem.ListQuery{Limit: 1, State: state}
		pages := 0
		for {
			if pages++; pages > 10000 {
				t.Fatal("List never ends")
			}
			page, err := s.List(ctx, q)
			if err != nil {
				t.Fatalf("List(%+v): %v", q, err)
			}
			for _, r := range page.Records {
				if _, ok := want[r.Key]; !ok {
					t.Fatalf("List returned %q, which is not a record of the store", r.Key)
				}
				if r.TTL <= 0 || r.TTL > time.Minute || r.Fingerprint != "fp" {
					t.Fatalf("List returned %+v", r)
				}
				got[r.Key] = r.State
			}
			if page.Next == "" {
				break
			}
			q.Cursor = page.Next
		}
		if pages < 2 {
			t.Errorf("state %v: %d records in %d page", state, len(got), pages)
		}
		for key, st := range want {
			if _, ok := got[key]; !ok && (state == 0 || st == state) {
				t.Fatalf("state %v: List missed %s (%v)", state, key, st)
			}
			if ok := got[key] == st || got[key] == 0; !ok || (state != 0 && got[key] != 0 && st != state) {
				t.Fatalf("state %v: %s listed as %v, is %v", state, key, got[key], st)
			}
		}
	}
	if _, err := s.List(ctx, idem.ListQuery{Limit: 1, Cursor: "99:0"}); err == nil {
		t.Fatal("List with a cursor naming a node the store does not have: no error")
	}
}
