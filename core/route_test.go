package idem

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// clockStore is a Store and Extender whose records expire by a clock the
// test moves, and which records the durations it is given.
type clockStore struct {
	mu        sync.Mutex
	now       time.Time
	recs      map[string]clockRecord
	leaseLeft bool                       // Acquire reports Record.LeaseLeft
	leases    map[string][]time.Duration // by key: Acquire's lease, then each Extend's
	kept      map[string]time.Duration   // by key: Complete's retention
	extended  map[string]int             // by key: Extend calls
}

type clockRecord struct {
	Record
	expires time.Time
}

func newClockStore() *clockStore {
	return &clockStore{now: time.Unix(1e9, 0), recs: map[string]clockRecord{}, leases: map[string][]time.Duration{},
		kept: map[string]time.Duration{}, extended: map[string]int{}}
}

func (s *clockStore) advance(d time.Duration) {
	s.mu.Lock()
	s.now = s.now.Add(d)
	s.mu.Unlock()
}

// live returns key's record if it has not expired; s.mu is held.
func (s *clockStore) live(key string) (clockRecord, bool) {
	r, ok := s.recs[key]
	return r, ok && s.now.Before(r.expires)
}

func (s *clockStore) Acquire(_ context.Context, key, token, fp string, lease time.Duration) (Record, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.live(key); ok {
		rec := r.Record
		if s.leaseLeft && rec.State == StateInProgress {
			rec.LeaseLeft = r.expires.Sub(s.now)
		}
		return rec, false, nil
	}
	s.recs[key] = clockRecord{Record{State: StateInProgress, Fingerprint: fp, Token: token}, s.now.Add(lease)}
	s.leases[key] = append(s.leases[key], lease)
	return Record{}, true, nil
}

func (s *clockStore) owned(key, token string) (clockRecord, bool) {
	r, ok := s.live(key)
	return r, ok && r.State == StateInProgress && r.Token == token
}

func (s *clockStore) Complete(_ context.Context, key, token string, resp []byte, retention time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.owned(key, token)
	if !ok {
		return ErrNotOwner
	}
	s.kept[key] = retention
	s.recs[key] = clockRecord{Record{State: StateCompleted, Fingerprint: r.Fingerprint, Token: token, Response: slices.Clone(resp)}, s.now.Add(retention)}
	return nil
}

func (s *clockStore) Release(_ context.Context, key, token string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.owned(key, token); !ok {
		return ErrNotOwner
	}
	delete(s.recs, key)
	return nil
}

func (s *clockStore) Extend(_ context.Context, key, token string, lease time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.owned(key, token)
	if !ok {
		return ErrNotOwner
	}
	s.extended[key]++
	s.leases[key] = append(s.leases[key], lease)
	r.expires = s.now.Add(lease)
	s.recs[key] = r
	return nil
}

func (s *clockStore) Get(_ context.Context, key string) (Record, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.live(key)
	return r.Record, ok, nil
}

func (s *clockStore) count(key string) (extends int, leases []time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.extended[key], slices.Clone(s.leases[key])
}

// waitFor polls cond until it holds; the deadline is a hang guard only.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
	}
}

func postTo(route, key string) *Request {
	return &Request{Method: "POST", Route: route, Path: route, Keys: []string{key}, Principal: "p"}
}

// TestRouteRetention: a route with a short retention completes its records
// for that long, so they expire while another route's record is still
// replayed.
func TestRouteRetention(t *testing.T) {
	store := newClockStore()
	e, err := New(store, WithRoute("POST", "/short", RouteRetention(time.Hour)), WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, route := range []string{"/short", "/long"} {
		x, resp := e.Begin(ctx, postTo(route, "k"))
		if x == nil {
			t.Fatalf("%s: %v, want an execution", route, resp)
		}
		x.Finish(201, nil)
	}
	short, long := ScopedKey("p", "POST", "/short", "k"), ScopedKey("p", "POST", "/long", "k")
	if store.kept[short] != time.Hour || store.kept[long] != DefaultRetention {
		t.Fatalf("retentions %v and %v, want 1h for the route and the engine's %v", store.kept[short], store.kept[long], DefaultRetention)
	}
	store.advance(2 * time.Hour)
	if x, resp := e.Begin(ctx, postTo("/short", "k")); x == nil {
		t.Errorf("/short after its retention: %d, want a new execution", resp.Status)
	} else {
		x.Fail()
	}
	if x, resp := e.Begin(ctx, postTo("/long", "k")); x != nil || !resp.IsReplay() {
		t.Errorf("/long within the engine's retention: want its replay")
		if x != nil {
			x.Fail()
		}
	}
}

// TestRouteLease: each route's lease is taken and renewed with its own
// duration, every lease/3: a route with a short lease is renewed while a
// route with a long one, started first, has not needed a renewal yet, both
// when the engine's lease is the short one and when it is the long one.
func TestRouteLease(t *testing.T) {
	for _, tc := range []struct {
		name   string
		lease  time.Duration // the engine's
		routes Option
	}{
		{"long route", 60 * time.Millisecond, WithRoute("POST", "/long", RouteLease(time.Hour))},
		{"short route", time.Hour, WithRoute("POST", "/short", RouteLease(60*time.Millisecond))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := newClockStore()
			e, err := New(store, WithStoreTimeout(10*time.Millisecond), WithLease(tc.lease), tc.routes, WithLogger(slog.New(slog.DiscardHandler)))
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			long, _ := e.Begin(ctx, postTo("/long", "k"))
			short, _ := e.Begin(ctx, postTo("/short", "k"))
			if long == nil || short == nil {
				t.Fatal("no execution")
			}
			shortKey, longKey := ScopedKey("p", "POST", "/short", "k"), ScopedKey("p", "POST", "/long", "k")
			waitFor(t, "three renewals of the short lease", func() bool { n, _ := store.count(shortKey); return n >= 3 })
			short.Fail()
			long.Fail()
			n, leases := store.count(longKey)
			if n != 0 || len(leases) != 1 || leases[0] != time.Hour {
				t.Errorf("long lease: %d renewals, leases %v; want 0 renewals and one lease of 1h", n, leases)
			}
			_, leases = store.count(shortKey)
			for _, l := range leases {
				if l != 60*time.Millisecond {
					t.Errorf("short lease: leases %v, want 60ms each", leases)
					break
				}
			}
		})
	}
}

// TestRouteOptionsValidate: a route's lease and retention follow the
// engine's rules (> 0, the lease floor), and a later option wins.
func TestRouteOptionsValidate(t *testing.T) {
	for name, opt := range map[string]Option{
		"zero lease":      WithRoute("POST", "/r", RouteLease(0)),
		"lease floor":     WithRoute("POST", "/r", RouteLease(7*time.Second)), // 4 × the default 2s store timeout is 8s
		"zero retention":  WithRoute("POST", "/r", RouteRetention(0)),
		"negative":        WithRoute("POST", "/r", RouteRetention(-time.Second)),
		"bad fingerprint": WithRoute("POST", "/r", RouteFingerprint(NewFingerprinter("", appendBodyRaw))),
	} {
		_, err := New(nopStore{}, opt)
		if err == nil {
			t.Errorf("%s: New succeeded", name)
		} else if name != "bad fingerprint" && !strings.Contains(err.Error(), `"/r"`) {
			t.Errorf("%s: error %q does not name the route", name, err)
		}
	}
	e, err := New(nopStore{}, WithLease(time.Minute), WithRoute("POST", "/r", RouteLease(10*time.Second)),
		WithRoute("POST", "/r", RouteRetention(time.Hour)), WithRoute("POST", "/r", RouteLease(20*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	if p := e.route("POST", "/r"); p.lease != 20*time.Second || p.retention != time.Hour || p.fingerprint.ID() != "" {
		t.Errorf("route policy %+v, want lease 20s, retention 1h, default fingerprint", *p)
	}
	if p := e.route("PATCH", "/r"); p.lease != time.Minute || p.retention != DefaultRetention {
		t.Errorf("other route's policy %+v, want the engine's", *p)
	}
}
