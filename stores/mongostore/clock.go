package mongostore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// defaultMaxDocSize is MongoDB's maximum BSON document size, used until hello
// reports the server's own maxBsonObjectSize.
const defaultMaxDocSize = 16 << 20

// clock holds the offset between the local clock and the server's.
type clock struct {
	mu      sync.Mutex
	have    bool          // an offset was measured
	offset  time.Duration // server time minus local time
	at      time.Time     // local time of the last measurement (monotonic)
	maxDoc  int           // maxBsonObjectSize from the last hello; 0 = unknown
	pending chan struct{} // non-nil while a measurement runs; closed when it ends
}

func (c *clock) maxDocSize() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.maxDoc > 0 {
		return c.maxDoc
	}
	return defaultMaxDocSize
}

// now returns the server's current time: the local clock corrected by the
// measured offset. The first call measures the offset (one hello); a call
// that finds it older than the refresh interval measures it again while
// concurrent calls keep using the old one. A failed refresh keeps the old
// offset (the operation that follows reports the outage) and is retried a
// second later; with no offset at all, the failure is returned.
func (s *Store) now(ctx context.Context) (time.Time, error) {
	c := &s.clk
	for {
		c.mu.Lock()
		if c.have && (c.pending != nil || time.Since(c.at) < s.refresh) {
			off := c.offset
			c.mu.Unlock()
			return time.Now().Add(off), nil
		}
		if c.pending != nil { // the first measurement is running: wait for it
			p := c.pending
			c.mu.Unlock()
			select {
			case <-p:
				continue
			case <-ctx.Done():
				return time.Time{}, ctx.Err()
			}
		}
		p := make(chan struct{})
		c.pending = p
		c.mu.Unlock()

		off, maxDoc, err := s.measure(ctx)

		c.mu.Lock()
		c.pending = nil
		close(p)
		switch {
		case err == nil:
			c.have, c.offset, c.at, c.maxDoc = true, off, time.Now(), maxDoc
		case c.have:
			// Keep the old offset and try again in a second, rather than
			// spending every operation's timeout on hello during an outage.
			c.at = time.Now().Add(min(time.Second, s.refresh) - s.refresh)
		}
		have, off := c.have, c.offset
		c.mu.Unlock()
		if err != nil && !have {
			return time.Time{}, fmt.Errorf("mongostore: read the server clock: %w", err)
		}
		return time.Now().Add(off), nil
	}
}

// measure runs hello and returns the server clock's offset from the local
// clock, taking the reply's localTime as the midpoint of the round trip, and
// the server's maxBsonObjectSize.
func (s *Store) measure(ctx context.Context) (time.Duration, int, error) {
	var reply struct {
		LocalTime         bson.DateTime `bson:"localTime"`
		MaxBsonObjectSize int32         `bson:"maxBsonObjectSize"`
	}
	start := time.Now()
	err := s.coll.Database().RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&reply)
	rtt := time.Since(start)
	if err != nil {
		return 0, 0, err
	}
	if reply.LocalTime == 0 {
		return 0, 0, errors.New("hello reply has no localTime")
	}
	return reply.LocalTime.Time().Sub(start.Add(rtt / 2)), int(reply.MaxBsonObjectSize), nil
}
