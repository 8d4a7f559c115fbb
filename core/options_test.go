package idem

import (
	"context"
	"strings"
	"testing"
	"time"
)

type nopStore struct{ Store }

func TestNewValidates(t *testing.T) {
	if _, err := New(nil); err == nil {
		t.Error("New(nil) succeeded")
	}
	for name, opt := range map[string]Option{
		"lease":     WithLease(0),
		"retention": WithRetention(-time.Second),
		"timeout":   WithStoreTimeout(0),
		"wait":      WithWait(-1),
		"body":      WithMaxBodyBytes(0),
		"response":  WithMaxResponseBytes(0),
		"header":    WithHeader(""),
		"uncertain": WithUncertainAfterCrash(-time.Second),
		"tombstone": WithTombstones(-time.Hour),
	} {
		if _, err := New(nopStore{}, opt); err == nil {
			t.Errorf("New with an invalid %s succeeded", name)
		}
	}
	e, err := New(nopStore{}, WithMethods("PUT", "GET"), WithHeader("x-request-key"))
	if err != nil {
		t.Fatal(err)
	}
	if !e.Covers("POST") || !e.Covers("PATCH") || !e.Covers("PUT") || e.Covers("GET") || e.Covers("DELETE") {
		t.Error("covered methods are wrong")
	}
	if e.Header() != "X-Request-Key" {
		t.Errorf("Header() = %q", e.Header())
	}
	if x, resp := e.Begin(context.Background(), &Request{Method: "GET"}); x != nil || resp != nil {
		t.Error("GET was not passed through")
	}
}

// TestLeaseFloor: a lease too short to be renewed before it lapses is
// refused with an error naming the floor (4 × the store timeout).
func TestLeaseFloor(t *testing.T) {
	for _, tc := range []struct {
		lease, timeout time.Duration
		ok             bool
	}{
		{DefaultLease, DefaultStoreTimeout, true},
		{time.Nanosecond, DefaultStoreTimeout, false},
		{time.Millisecond, DefaultStoreTimeout, false},
		{8 * time.Second, DefaultStoreTimeout, true},
		{8*time.Second - 1, DefaultStoreTimeout, false},
		{time.Second, 250 * time.Millisecond, true},
		{time.Second, time.Second, false},
	} {
		_, err := New(nopStore{}, WithLease(tc.lease), WithStoreTimeout(tc.timeout))
		if (err == nil) != tc.ok {
			t.Errorf("lease %v, store timeout %v: err %v, want ok=%v", tc.lease, tc.timeout, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), (4*tc.timeout).String()) {
			t.Errorf("lease %v: error %q does not name the floor %v", tc.lease, err, 4*tc.timeout)
		}
	}
}

// TestKeepNeedsKeeper: the keep options refuse a store that cannot keep records.
func TestKeepNeedsKeeper(t *testing.T) {
	for _, opt := range []Option{WithUncertainAfterCrash(time.Hour), WithTombstones(time.Hour)} {
		if _, err := New(nopStore{}, opt); err == nil || !strings.Contains(err.Error(), "idem.Keeper") {
			t.Errorf("New with a keep option on a store without Keeper = %v; want an error naming idem.Keeper", err)
		}
	}
}
