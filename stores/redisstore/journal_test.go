package redisstore_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/stores/redisstore"
)

// TestJournalLayout checks the keys of a record with a step journal: the
// record's '5' value, the journal hash in the record's Cluster slot, and
// the journal's expiry, the same millisecond as the record's after every
// transition (or its response key's under a tombstone keep), so that it
// never outlives its record.
func TestJournalLayout(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		client func(t *testing.T) redis.UniversalClient
		prefix func(p string) string
	}{
		{"Standalone", func(t *testing.T) redis.UniversalClient { return newClient(t) }, func(p string) string { return p }},
		{"Cluster", func(t *testing.T) redis.UniversalClient { return newClusterClient(t) }, func(p string) string { return p }},
		{"ClusterHashTag", func(t *testing.T) redis.UniversalClient { return newClusterClient(t) }, func(p string) string { return "{" + p + "}" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := tc.client(t)
			prefix := tc.prefix(newPrefix(t, c))
			t.Cleanup(func() { deletePrefix(c, prefix) })
			testJournalLayout(t, c, prefix)
		})
	}
}

func testJournalLayout(t *testing.T, c redis.UniversalClient, prefix string) {
	s := redisstore.New(c, redisstore.WithPrefix(prefix))
	ctx := ctxT(t)
	journalKey := func(key string) string {
		if prefix[0] == '{' {
			return prefix + key + ":j"
		}
		return prefix + key + ":j{" + prefix + key + "}"
	}
	// same checks that the journal of key expires in the same millisecond
	// as other (the record, or its response key).
	same := func(what, key, other string) {
		t.Helper()
		rec, err1 := c.PExpireTime(ctx, other).Result()
		j, err2 := c.PExpireTime(ctx, journalKey(key)).Result()
		if err1 != nil || err2 != nil || rec <= 0 || j != rec {
			t.Fatalf("%s: journal expires at %v, %v; its record (%s) at %v, %v", what, j, err2, other, rec, err1)
		}
	}
	key, tok := storetest.Key(), storetest.Token()
	if _, ok, err := s.Acquire(ctx, key, tok, "fp", time.Minute); err != nil || !ok {
		t.Fatalf("Acquire = %v, %v", ok, err)
	}
	if _, err := s.StartStep(ctx, key, tok, "charge", time.Hour); err != nil {
		t.Fatal(err)
	}
	v, err := c.Get(ctx, prefix+key).Result()
	if want := fmt.Sprintf("5%d:%s2:fp1:01:07:3600000", len(tok), tok); err != nil || v != want {
		t.Fatalf("record with a journal = %q, %v; want %q ('5' lp(token) lp(fp) lp(u) lp(t) lp(r))", v, err, want)
	}
	if ttl := c.PTTL(ctx, prefix+key).Val(); ttl <= time.Hour || ttl > time.Hour+time.Minute {
		t.Fatalf("TTL of a record with a journal = %v; want lease + retain (1h1m)", ttl)
	}
	if typ := c.Type(ctx, journalKey(key)).Val(); typ != "hash" {
		t.Fatalf("journal key holds a %q, want a hash", typ)
	}
	if cc, ok := c.(*redis.ClusterClient); ok {
		a, b := cc.ClusterKeySlot(ctx, prefix+key).Val(), cc.ClusterKeySlot(ctx, journalKey(key)).Val()
		if a != b {
			t.Fatalf("record in slot %d, journal in slot %d", a, b)
		}
	}
	same("StartStep", key, prefix+key)
	if err := s.FinishStep(ctx, key, tok, "charge", []byte("ch_1")); err != nil {
		t.Fatal(err)
	}
	same("FinishStep", key, prefix+key)
	if err := s.Extend(ctx, key, tok, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	same("Extend", key, prefix+key)
	if ttl := c.PTTL(ctx, prefix+key).Val(); ttl <= time.Hour+time.Minute || ttl > time.Hour+2*time.Minute {
		t.Fatalf("TTL after Extend = %v; want the new lease + retain (1h2m)", ttl)
	}
	if err := s.Complete(ctx, key, tok, []byte("resp"), 3*time.Hour); err != nil {
		t.Fatal(err)
	}
	if v := c.Get(ctx, prefix+key).Val(); v != "22:fpresp" {
		t.Fatalf("completed record with a journal = %q", v)
	}
	same("Complete", key, prefix+key)
	if st, err := s.Steps(ctx, key); err != nil || len(st) != 1 || string(st[0].Result) != "ch_1" {
		t.Fatalf("Steps of the completed record = %+v, %v", st, err)
	}

	// Under a tombstone keep the journal ends with the response (a tombstone has none).
	key, tok = storetest.Key(), storetest.Token()
	if _, ok, err := s.AcquireKeep(ctx, key, tok, "fp", time.Minute, idem.Keep{Tombstone: time.Hour}); err != nil || !ok {
		t.Fatalf("AcquireKeep = %v, %v", ok, err)
	}
	if _, err := s.StartStep(ctx, key, tok, "charge", time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, key, tok, []byte("resp"), 2*time.Hour); err != nil {
		t.Fatal(err)
	}
	respKey := journalKey(key)
	respKey = respKey[:len(prefix)+len(key)] + ":r" + respKey[len(prefix)+len(key)+2:]
	same("Complete under a tombstone keep", key, respKey)

	// Suspend: uncertain for keep, the journal kept as long; Resolve(nil) deletes both.
	key, tok = storetest.Key(), storetest.Token()
	if _, ok, err := s.Acquire(ctx, key, tok, "fp", time.Minute); err != nil || !ok {
		t.Fatalf("Acquire = %v, %v", ok, err)
	}
	if _, err := s.StartStep(ctx, key, tok, "charge", time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.Suspend(ctx, key, tok, 30*time.Minute); err != nil {
		t.Fatal(err)
	}
	same("Suspend", key, prefix+key)
	if ttl := c.PTTL(ctx, prefix+key).Val(); ttl <= 29*time.Minute || ttl > 30*time.Minute {
		t.Fatalf("TTL after Suspend = %v; want the keep (30m)", ttl)
	}
	if err := s.Resolve(ctx, key, nil, time.Hour); err != nil {
		t.Fatal(err)
	}
	if n := c.Exists(ctx, prefix+key, journalKey(key)).Val(); n != 0 {
		t.Fatalf("%d keys left after Resolve(nil)", n)
	}

	// Release and Evict delete the journal with the record; List skips it.
	for _, end := range []string{"Release", "Evict"} {
		key, tok = storetest.Key(), storetest.Token()
		if _, ok, err := s.Acquire(ctx, key, tok, "fp", time.Minute); err != nil || !ok {
			t.Fatalf("Acquire = %v, %v", ok, err)
		}
		if _, err := s.StartStep(ctx, key, tok, "charge", time.Hour); err != nil {
			t.Fatal(err)
		}
		page, err := s.List(ctx, idem.ListQuery{KeyPrefix: key, Limit: 10})
		if err != nil || len(page.Records) != 1 || page.Records[0].State != idem.StateInProgress {
			t.Fatalf("List of a record with a journal = %+v, %v; want the record alone", page.Records, err)
		}
		if end == "Release" {
			err = s.Release(ctx, key, tok)
		} else {
			err = s.Evict(ctx, key, idem.Record{State: idem.StateInProgress, Token: tok, Fingerprint: "fp"})
		}
		if err != nil {
			t.Fatalf("%s: %v", end, err)
		}
		if n := c.Exists(ctx, prefix+key, journalKey(key)).Val(); n != 0 {
			t.Fatalf("%d keys left after %s", n, end)
		}
	}

	// A journal found under a record that owns none (left by something
	// else) is neither read nor resumed: StartStep starts a new one.
	key, tok = storetest.Key(), storetest.Token()
	if _, ok, err := s.Acquire(ctx, key, tok, "fp", time.Minute); err != nil || !ok {
		t.Fatalf("Acquire = %v, %v", ok, err)
	}
	c.HSet(ctx, journalKey(key), "charge", "001"+"5:other"+"ch_old")
	if st, err := s.Steps(ctx, key); err != nil || st != nil {
		t.Fatalf("Steps of a record owning no journal = %+v, %v; want none", st, err)
	}
	if e, err := s.StartStep(ctx, key, tok, "charge", time.Hour); err != nil || e.Done || e.Token != tok {
		t.Fatalf("StartStep over a stale journal = %+v, %v; want a new entry", e, err)
	}
}

// TestJournalRoundTrips counts the round trips of the journal's paths
// (scripts warm in the server's cache) and checks that a handler using no
// step pays nothing for them.
func TestJournalRoundTrips(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	hook := &countHook{}
	c.AddHook(hook)
	s := redisstore.New(c, redisstore.WithPrefix(newPrefix(t, c)))
	ctx := ctxT(t)
	counting := true
	expect := func(what string, want int, f func() error) {
		t.Helper()
		hook.reset()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if n := hook.count(); counting && n != want {
			t.Errorf("%s: %d round trips %v; want %d", what, n, hook.names(), want)
		}
	}
	for _, warm := range []bool{true, false} {
		counting = !warm
		key, tok := storetest.Key(), storetest.Token()
		expect("Acquire of a fresh key", 1, func() error { _, _, err := s.Acquire(ctx, key, tok, "fp", time.Minute); return err })
		expect("StartStep", 1, func() error { _, err := s.StartStep(ctx, key, tok, "charge", time.Hour); return err })
		expect("FinishStep", 1, func() error { return s.FinishStep(ctx, key, tok, "charge", []byte("x")) })
		expect("StartStep of a done step", 1, func() error { _, err := s.StartStep(ctx, key, tok, "charge", time.Hour); return err })
		expect("Extend of a record with a journal", 2, func() error { return s.Extend(ctx, key, tok, time.Minute) })
		expect("Complete of a record with a journal", 2, func() error { return s.Complete(ctx, key, tok, []byte("r"), time.Hour) })
		expect("Steps", 1, func() error { _, err := s.Steps(ctx, key); return err })
		key, tok = storetest.Key(), storetest.Token()
		expect("Acquire of a fresh key", 1, func() error { _, _, err := s.Acquire(ctx, key, tok, "fp", time.Minute); return err })
		expect("Extend without a journal", 1, func() error { return s.Extend(ctx, key, tok, time.Minute) })
		expect("Complete without a journal", 1, func() error { return s.Complete(ctx, key, tok, []byte("r"), time.Hour) })
	}
}
