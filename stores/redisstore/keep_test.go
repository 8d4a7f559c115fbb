package redisstore_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/stores/redisstore"
)

// respKey is the documented name of a record's response key.
func respKey(prefix, key string, tagged bool) string {
	if tagged {
		return prefix + key + ":r"
	}
	return prefix + key + ":r{" + prefix + key + "}"
}

// TestKeepLayout checks the documented values and TTLs of records acquired
// under a non-zero Keep, and that the zero Keep keeps the old layout.
func TestKeepLayout(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	prefix := newPrefix(t, c)
	s := redisstore.New(c, redisstore.WithPrefix(prefix))
	key, tok := storetest.Key(), storetest.Token()
	keep := idem.Keep{Uncertain: time.Hour, Tombstone: 48 * time.Hour}
	if _, ok, err := s.AcquireKeep(ctxT(t), key, tok, "fp-1", time.Minute, keep); err != nil || !ok {
		t.Fatalf("AcquireKeep = %v, %v", ok, err)
	}
	v, err := c.Get(ctxT(t), prefix+key).Result()
	if want := fmt.Sprintf("3%d:%s4:fp-17:36000009:172800000", len(tok), tok); err != nil || v != want {
		t.Fatalf("kept in-progress value = %q, %v; want %q ('3' lp(token) lp(fingerprint) lp(u) lp(t))", v, err, want)
	}
	if ttl := c.PTTL(ctxT(t), prefix+key).Val(); ttl <= time.Hour+59*time.Second || ttl > time.Hour+time.Minute {
		t.Fatalf("kept in-progress TTL = %v; want lease + Keep.Uncertain (1h1m)", ttl)
	}
	if err := s.Extend(ctxT(t), key, tok, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if ttl := c.PTTL(ctxT(t), prefix+key).Val(); ttl <= time.Hour+119*time.Second || ttl > time.Hour+2*time.Minute {
		t.Fatalf("TTL after Extend(2m) = %v; want lease + Keep.Uncertain (1h2m)", ttl)
	}
	resp := []byte{1, 0xc9, 0x01, 0, 0, 1, 0xff}
	if err := s.Complete(ctxT(t), key, tok, resp, 2*time.Hour); err != nil {
		t.Fatal(err)
	}
	v, _ = c.Get(ctxT(t), prefix+key).Result()
	if want := "44:fp-19:172800000"; v != want {
		t.Fatalf("kept completed value = %q; want %q ('4' lp(fingerprint) lp(t), no response)", v, want)
	}
	if ttl := c.PTTL(ctxT(t), prefix+key).Val(); ttl <= 50*time.Hour-time.Minute || ttl > 50*time.Hour {
		t.Fatalf("kept completed TTL = %v; want retention + Keep.Tombstone (50h)", ttl)
	}
	rk := respKey(prefix, key, false)
	if got, err := c.Get(ctxT(t), rk).Result(); err != nil || got != string(resp) {
		t.Fatalf("response key %q = %q, %v; want the response", rk, got, err)
	}
	if ttl := c.PTTL(ctxT(t), rk).Val(); ttl <= 2*time.Hour-time.Minute || ttl > 2*time.Hour {
		t.Fatalf("response key TTL = %v; want the 2h retention", ttl)
	}
	rec, ok, err := s.Acquire(ctxT(t), key, storetest.Token(), "fp-1", time.Minute)
	if err != nil || ok || rec.State != idem.StateCompleted || string(rec.Response) != string(resp) {
		t.Fatalf("replay of a kept completed record = %+v, %v, %v", rec, ok, err)
	}
	// The response key gone (the retention ended): a tombstone.
	c.Del(ctxT(t), rk)
	if rec, ok, err := s.Acquire(ctxT(t), key, storetest.Token(), "fp-1", time.Minute); err != nil || ok || rec.State != idem.StateExpired || rec.Fingerprint != "fp-1" {
		t.Fatalf("Acquire of a tombstone = %+v, %v, %v", rec, ok, err)
	}
	// Only the tombstone keep needs the '3' value: Keep{} stays '1'.
	key2 := storetest.Key()
	if _, ok, err := s.AcquireKeep(ctxT(t), key2, tok, "fp-2", time.Minute, idem.Keep{}); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if v, _ := c.Get(ctxT(t), prefix+key2).Result(); v != fmt.Sprintf("1%d:%s4:fp-2", len(tok), tok) {
		t.Fatalf("zero-Keep value = %q; want the '1' layout", v)
	}
	key3 := storetest.Key()
	if _, ok, err := s.AcquireKeep(ctxT(t), key3, tok, "fp-3", time.Minute, idem.Keep{Uncertain: time.Second}); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if err := s.Complete(ctxT(t), key3, tok, resp, time.Hour); err != nil {
		t.Fatal(err)
	}
	if v, _ := c.Get(ctxT(t), prefix+key3).Result(); v != "24:fp-3"+string(resp) {
		t.Fatalf("completed value without a tombstone keep = %q; want the '2' layout", v)
	}
	if n := c.Exists(ctxT(t), respKey(prefix, key3, false)).Val(); n != 0 {
		t.Fatal("a record completed without a tombstone keep has a response key")
	}
}

// TestOldRecords: records written by the previous version (the '1' and '2'
// values, unchanged) are read and completed by this one, under any Keep.
func TestOldRecords(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	prefix := newPrefix(t, c)
	s := redisstore.New(c, redisstore.WithPrefix(prefix))
	inProgress, completed := storetest.Key(), storetest.Key()
	c.Set(ctxT(t), prefix+inProgress, "13:tok4:fp-1", time.Minute)
	c.Set(ctxT(t), prefix+completed, "24:fp-2response", time.Minute)
	keep := idem.Keep{Uncertain: time.Hour, Tombstone: time.Hour}
	rec, ok, err := s.AcquireKeep(ctxT(t), inProgress, "other", "fp-1", time.Minute, keep)
	if err != nil || ok || rec.State != idem.StateInProgress || rec.Token != "tok" || rec.LeaseLeft <= 0 {
		t.Fatalf("AcquireKeep of an old in-progress record = %+v, %v, %v", rec, ok, err)
	}
	rec, ok, err = s.AcquireKeep(ctxT(t), completed, "other", "fp-2", time.Minute, keep)
	if err != nil || ok || rec.State != idem.StateCompleted || string(rec.Response) != "response" {
		t.Fatalf("AcquireKeep of an old completed record = %+v, %v, %v", rec, ok, err)
	}
	if err := s.Complete(ctxT(t), inProgress, "tok", []byte("done"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if v := c.Get(ctxT(t), prefix+inProgress).Val(); v != "24:fp-1done" {
		t.Fatalf("old in-progress record completed as %q; want the '2' layout (it carries no Keep)", v)
	}
}

// TestKeepCluster runs tombstones on a Cluster with prefixes with and
// without a hash tag (the response key shares the record's slot), and
// checks that a prefix whose braces form no hash tag refuses a tombstone
// keep before anything runs.
func TestKeepCluster(t *testing.T) {
	t.Parallel()
	c := newClusterClient(t)
	base := newPrefix(t, c)
	for _, p := range []struct {
		prefix string
		tagged bool
	}{{base, false}, {base + "{" + base + "}:", true}, {"{" + base + "t}:", true}} {
		t.Cleanup(func() { deletePrefix(c, p.prefix) })
		s := redisstore.New(c, redisstore.WithPrefix(p.prefix))
		key, tok := storetest.Key(), storetest.Token()
		rk := respKey(p.prefix, key, p.tagged)
		if a, b := c.ClusterKeySlot(ctxT(t), p.prefix+key).Val(), c.ClusterKeySlot(ctxT(t), rk).Val(); a != b {
			t.Fatalf("prefix %q: record key in slot %d, response key %q in slot %d", p.prefix, a, rk, b)
		}
		if _, ok, err := s.AcquireKeep(ctxT(t), key, tok, "fp", time.Minute, idem.Keep{Tombstone: time.Hour}); err != nil || !ok {
			t.Fatalf("prefix %q: AcquireKeep = %v, %v", p.prefix, ok, err)
		}
		if err := s.Complete(ctxT(t), key, tok, []byte("response"), time.Hour); err != nil {
			t.Fatalf("prefix %q: Complete = %v", p.prefix, err)
		}
		if c.Exists(ctxT(t), rk).Val() != 1 {
			t.Fatalf("prefix %q: no response key %q", p.prefix, rk)
		}
		if rec, ok, err := s.Acquire(ctxT(t), key, storetest.Token(), "fp", time.Minute); err != nil || ok || string(rec.Response) != "response" {
			t.Fatalf("prefix %q: replay = %+v, %v, %v", p.prefix, rec, ok, err)
		}
	}
	for _, prefix := range []string{base + "a}b:", base + "x{y:", base + "{}z:"} {
		s := redisstore.New(c, redisstore.WithPrefix(prefix))
		if _, ok, err := s.AcquireKeep(ctxT(t), storetest.Key(), "tok", "fp", time.Minute, idem.Keep{Tombstone: time.Hour}); err == nil || ok {
			t.Fatalf("prefix %q: AcquireKeep with a tombstone = %v, %v; want an error", prefix, ok, err)
		}
		key := storetest.Key()
		if _, ok, err := s.AcquireKeep(ctxT(t), key, "tok", "fp", time.Minute, idem.Keep{Uncertain: time.Hour}); err != nil || !ok {
			t.Fatalf("prefix %q: AcquireKeep without a tombstone = %v, %v", prefix, ok, err)
		}
		if err := s.Complete(ctxT(t), key, "tok", []byte("response"), time.Minute); err != nil {
			t.Fatalf("prefix %q: Complete = %v", prefix, err)
		}
		c.Del(ctxT(t), prefix+key)
	}
}

// TestKeepList lists kept records: in progress and uncertain each as its
// state, completed ones as completed, never a tombstone or a response key.
func TestKeepList(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	prefix := newPrefix(t, c)
	for _, tagged := range []bool{false, true} {
		p := prefix
		if tagged {
			p += "{tag}:"
		}
		s := redisstore.New(c, redisstore.WithPrefix(p))
		keep := idem.Keep{Uncertain: time.Hour, Tombstone: time.Hour}
		want := map[string]idem.State{}
		add := func(st idem.State, lease, retention time.Duration) string {
			key, tok := storetest.Key(), storetest.Token()
			if _, ok, err := s.AcquireKeep(ctxT(t), key, tok, "fp", lease, keep); err != nil || !ok {
				t.Fatal(ok, err)
			}
			if retention > 0 {
				if err := s.Complete(ctxT(t), key, tok, []byte("response"), retention); err != nil {
					t.Fatal(err)
				}
			}
			want[key] = st
			return key
		}
		add(idem.StateInProgress, time.Minute, 0)
		add(idem.StateUncertain, time.Millisecond, 0)
		add(idem.StateCompleted, time.Minute, time.Minute)
		tomb := add(0, time.Minute, time.Millisecond)
		delete(want, tomb)
		time.Sleep(20 * time.Millisecond)
		got := map[string]idem.State{}
		q := idem.ListQuery{Limit: 100}
		for {
			page, err := s.List(ctxT(t), q)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range page.Records {
				if _, dup := got[r.Key]; dup || r.TTL <= 0 || r.TTL > time.Hour+time.Minute {
					t.Fatalf("tagged %v: listed %+v (again: %v)", tagged, r, dup)
				}
				got[r.Key] = r.State
			}
			if q.Cursor = page.Next; q.Cursor == "" {
				break
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("tagged %v: List = %v; want %v", tagged, got, want)
		}
	}
}

// TestKeepRoundTrips counts the commands of the kept paths: a fresh
// request costs the same as without a Keep; a kept record found costs one
// more round trip (a script reading its state), as an in-progress one does.
func TestKeepRoundTrips(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	hook := &countHook{}
	c.AddHook(hook)
	prefix := newPrefix(t, c)
	s := redisstore.New(c, redisstore.WithPrefix(prefix))
	keep := idem.Keep{Uncertain: time.Hour, Tombstone: time.Hour}
	warm := storetest.Key()
	if _, _, err := s.AcquireKeep(ctxT(t), warm, "tok", "fp", time.Minute, keep); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctxT(t), warm, "tok", []byte("r"), time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Acquire(ctxT(t), warm, "tok2", "fp", time.Minute); err != nil {
		t.Fatal(err)
	}
	expect := func(what string, want int, f func() error) {
		t.Helper()
		hook.reset()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if n := hook.count(); n != want {
			t.Errorf("%s: %d round trips %v; want %d", what, n, hook.names(), want)
		} else {
			t.Logf("%s: %d round trip(s) %v", what, n, hook.names())
		}
	}
	key := storetest.Key()
	expect("fresh AcquireKeep", 1, func() error {
		_, ok, err := s.AcquireKeep(ctxT(t), key, "tok", "fp", time.Minute, keep)
		if !ok {
			return fmt.Errorf("not acquired: %w", err)
		}
		return err
	})
	expect("Acquire of a kept in-progress record", 2, func() error {
		rec, _, err := s.Acquire(ctxT(t), key, "tok2", "fp", time.Minute)
		if rec.State != idem.StateInProgress || rec.LeaseLeft <= 0 || rec.LeaseLeft > time.Minute {
			return fmt.Errorf("got %+v", rec)
		}
		return err
	})
	expect("Complete under a tombstone keep", 1, func() error { return s.Complete(ctxT(t), key, "tok", []byte("r"), time.Minute) })
	// A Store value that never acquired under a tombstone keep completes
	// on the record key alone, and again with the response key when the
	// script asks for it.
	other := redisstore.New(c, redisstore.WithPrefix(prefix))
	key2 := storetest.Key()
	if _, ok, err := s.AcquireKeep(ctxT(t), key2, "tok", "fp", time.Minute, keep); err != nil || !ok {
		t.Fatal(ok, err)
	}
	expect("Complete under a tombstone keep by a store that never used one", 2, func() error {
		return other.Complete(ctxT(t), key2, "tok", []byte("r"), time.Minute)
	})
	if v := c.Get(ctxT(t), prefix+key2).Val(); !strings.HasPrefix(v, "4") {
		t.Fatalf("completed value %q; want the '4' layout", v)
	}
	expect("Complete without a keep by that store", 1, func() error {
		k := storetest.Key()
		if _, ok, err := other.Acquire(ctxT(t), k, "tok", "fp", time.Minute); err != nil || !ok {
			return fmt.Errorf("acquire: %v, %w", ok, err)
		}
		hook.reset()
		return other.Complete(ctxT(t), k, "tok", []byte("r"), time.Minute)
	})
	expect("replay under a tombstone keep", 2, func() error {
		rec, _, err := s.Acquire(ctxT(t), key, "tok2", "fp", time.Minute)
		if string(rec.Response) != "r" {
			return fmt.Errorf("got %+v", rec)
		}
		return err
	})
}

// TestTombstoneMemory reports MEMORY USAGE of a record completed under a
// tombstone keep (record key and response key) and of its tombstone, next
// to a plain completed record, with a 200-byte body; and bounds them.
func TestTombstoneMemory(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	prefix := newPrefix(t, c)
	s := redisstore.New(c, redisstore.WithPrefix(prefix))
	fp := idem.Fingerprint("POST", "/v1/payments", "", "application/json", []byte("{}"))
	body := []byte(`{"id":"pay_1","amount":4200,"currency":"EUR","status":"succeeded","customer":"cus_123","description":"` +
		strings.Repeat("x", 200) + `"}`)[:200]
	enc := append([]byte("\x01\xc9\x01\x02\x0cContent-Type\x01\x10application/json\x08Location\x01\x12/v1/payments/pay_1"), body...)
	usage := func(k string) int64 {
		n, err := c.MemoryUsage(ctxT(t), k).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		return n
	}
	complete := func(keep idem.Keep) string {
		key, tok := storetest.Key(), storetest.Token()
		if _, ok, err := s.AcquireKeep(ctxT(t), key, tok, fp, time.Minute, keep); err != nil || !ok {
			t.Fatal(ok, err)
		}
		if err := s.Complete(ctxT(t), key, tok, enc, time.Hour); err != nil {
			t.Fatal(err)
		}
		return key
	}
	plain := usage(prefix + complete(idem.Keep{}))
	key := complete(idem.Keep{Tombstone: 30 * 24 * time.Hour})
	record, response := usage(prefix+key), usage(respKey(prefix, key, false))
	c.Del(ctxT(t), respKey(prefix, key, false)) // what the retention's end leaves
	tombstone := usage(prefix + key)
	t.Logf("MEMORY USAGE (key %d bytes, %d-byte encoded response): completed %d bytes; completed under a tombstone keep %d (record key %d + response key %d); tombstone %d",
		len(prefix+key), len(enc), plain, record+response, record, response, tombstone)
	// A response key's name holds the record key twice (see appendKeys).
	if tombstone != record || tombstone > 256 || record+response > plain+2*int64(len(prefix+key))+160 {
		t.Fatalf("tombstone %d bytes, kept completed %d + %d, plain %d: out of bounds", tombstone, record, response, plain)
	}
}
