package redisstore

import (
	"testing"

	idem "github.com/idemkit/idem/core"
)

// TestAtLastMillisecond: a record kept only as a tombstone (Keep.Uncertain
// 0) read when its key's PTTL is 0 (under a millisecond left) is in
// progress, never uncertain; under Keep.Uncertain it is uncertain once the
// PTTL is at most the keep. tests/model's TestModelRedis found a Get
// answering uncertain for a record without an uncertain keep.
func TestAtLastMillisecond(t *testing.T) {
	for _, c := range []struct {
		u, pttl int64
		want    idem.State
	}{
		{0, 0, idem.StateInProgress},
		{0, 5, idem.StateInProgress},
		{100, 100, idem.StateUncertain},
		{100, 101, idem.StateInProgress},
	} {
		st, err := parseValue(newAcquire("p:", "k", "tok", "fp", 60000, c.u, 3600000).value)
		if err != nil {
			t.Fatal(err)
		}
		if rec, _ := st.at(c.pttl, "", false, 0); rec.State != c.want {
			t.Errorf("Keep.Uncertain %d ms, PTTL %d ms: %v, want %v", c.u, c.pttl, rec.State, c.want)
		}
	}
}
