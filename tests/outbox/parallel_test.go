package outboxtest

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/outbox"
)

// call is one Publish call a spanRecorder saw: its message and when it
// started and ended.
type call struct {
	id         string
	start, end time.Time
}

// spanRecorder is a Publisher recording every call's start and end. Until
// two calls have been in flight at once, a call waits (up to rendezvous)
// for another to start: relays that can publish in parallel meet there at
// once, while relays that cannot make the first call wait it out (and
// the later ones then do not wait).
type spanRecorder struct {
	rendezvous time.Duration
	mu         sync.Mutex
	inFlight   int
	met        chan struct{}
	calls      []call
}

func (s *spanRecorder) Publish(ctx context.Context, m outbox.Message) error {
	s.mu.Lock()
	c := call{id: m.ID, start: time.Now()}
	s.inFlight++
	if s.inFlight == 2 {
		select {
		case <-s.met:
		default:
			close(s.met)
		}
	}
	s.mu.Unlock()
	t := time.NewTimer(s.rendezvous)
	select {
	case <-s.met:
	case <-t.C:
		s.mu.Lock()
		select {
		case <-s.met:
		default:
			close(s.met) // waited out once: the other calls do not wait
		}
		s.mu.Unlock()
	case <-ctx.Done():
	}
	t.Stop()
	s.mu.Lock()
	s.inFlight--
	c.end = time.Now()
	s.calls = append(s.calls, c)
	s.mu.Unlock()
	return nil
}

// maxOverlap returns the most calls in flight at one moment, and the ids
// of messages two calls published at one moment.
func maxOverlap(calls []call) (most int, twice []string) {
	type event struct {
		at    time.Time
		delta int
		id    string
	}
	var events []event
	for _, c := range calls {
		events = append(events, event{c.start, 1, c.id}, event{c.end, -1, c.id})
	}
	slices.SortFunc(events, func(a, b event) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.delta - b.delta // an end before a start at the same instant
	})
	n, byID := 0, map[string]int{}
	for _, e := range events {
		n += e.delta
		byID[e.id] += e.delta
		most = max(most, n)
		if byID[e.id] > 1 {
			twice = append(twice, e.id)
		}
	}
	return most, twice
}

// TestClaimsInParallel runs two relays of two workers each over a backlog
// on each database: at some moment at least two Publish calls are in
// flight (the workers hold different partitions at once; on MariaDB a
// claim that locks every partition it scans allows one), never two calls
// with the same message, and every committed message is published once.
func TestClaimsInParallel(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			db, _ := openDB(t, d)
			ob := newOutbox(t, db, d, outbox.WithPartitions(8))
			committed := enqueue(t, db, ob, 120, 16)
			// The rendezvous is a hang guard: far longer than a claim on a
			// loaded machine, and the publish timeout longer still.
			rec := &spanRecorder{rendezvous: 30 * time.Second, met: make(chan struct{})}
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			for range 2 {
				r, err := outbox.NewRelay(db, ob, rec, outbox.WithWorkers(2), outbox.WithBatchSize(5), outbox.WithLogger(quiet),
					outbox.WithPollInterval(10*time.Millisecond), outbox.WithPublishTimeout(time.Minute))
				if err != nil {
					t.Fatal(err)
				}
				wg.Add(1)
				go func() { defer wg.Done(); _ = r.Run(ctx) }()
			}
			waitFor(t, "an empty outbox", 5*time.Minute, func() bool { return unsent(t, db, ob.Table()) == 0 })
			cancel()
			wg.Wait()
			most, twice := maxOverlap(rec.calls)
			if most < 2 {
				t.Errorf("at most %d Publish call in flight at once over %d calls; want 2 or more (workers claiming partitions in parallel)", most, len(rec.calls))
			}
			if len(twice) > 0 {
				t.Errorf("messages published by two calls at once: %v", twice)
			}
			seen := map[string]int{}
			for _, c := range rec.calls {
				seen[c.id]++
			}
			for id := range committed {
				if seen[id] != 1 {
					t.Errorf("message %s published %d times, want 1", id, seen[id])
				}
			}
			if len(seen) != len(committed) {
				t.Errorf("%d distinct messages published, %d committed", len(seen), len(committed))
			}
			t.Logf("%s: %d calls, at most %d in flight at once", d, len(rec.calls), most)
		})
	}
}
