package idem

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"
)

// scriptStore is an in-memory Store whose calls take at least delay and
// whose next failures are scripted per operation, to check what the engine
// reports in its events. (Real stores run storetest in their own modules.)
type scriptStore struct {
	delay time.Duration

	mu    sync.Mutex
	recs  map[string]Record
	fails map[StoreOp][]error // errors returned by the next calls, in order
}

func newScriptStore(delay time.Duration) *scriptStore {
	return &scriptStore{delay: delay, recs: map[string]Record{}, fails: map[StoreOp][]error{}}
}

func (s *scriptStore) failNext(op StoreOp, errs ...error) {
	s.mu.Lock()
	s.fails[op] = append(s.fails[op], errs...)
	s.mu.Unlock()
}

// call waits delay, locks s.mu (the caller unlocks it) and returns the
// scripted error for op, if any.
func (s *scriptStore) call(op StoreOp) error {
	time.Sleep(s.delay) // a lower bound for the durations reported, not synchronisation
	s.mu.Lock()
	if errs := s.fails[op]; len(errs) > 0 {
		s.fails[op] = errs[1:]
		return errs[0]
	}
	return nil
}

func (s *scriptStore) Acquire(_ context.Context, key, token, fp string, _ time.Duration) (Record, bool, error) {
	err := s.call(OpAcquire)
	defer s.mu.Unlock()
	if err != nil {
		return Record{}, false, err
	}
	if rec, ok := s.recs[key]; ok {
		return rec, false, nil
	}
	s.recs[key] = Record{State: StateInProgress, Fingerprint: fp, Token: token}
	return Record{}, true, nil
}

func (s *scriptStore) Complete(_ context.Context, key, token string, resp []byte, _ time.Duration) error {
	err := s.call(OpComplete)
	defer s.mu.Unlock()
	if err != nil {
		return err
	}
	rec, ok := s.owned(key, token)
	if !ok {
		return ErrNotOwner
	}
	s.recs[key] = Record{State: StateCompleted, Fingerprint: rec.Fingerprint, Response: slices.Clone(resp)}
	return nil
}

func (s *scriptStore) Release(_ context.Context, key, token string) error {
	err := s.call(OpRelease)
	defer s.mu.Unlock()
	if err != nil {
		return err
	}
	if _, ok := s.owned(key, token); !ok {
		return ErrNotOwner
	}
	delete(s.recs, key)
	return nil
}

func (s *scriptStore) Extend(_ context.Context, key, token string, _ time.Duration) error {
	err := s.call(OpExtend)
	defer s.mu.Unlock()
	if err != nil {
		return err
	}
	if _, ok := s.owned(key, token); !ok {
		return ErrNotOwner
	}
	return nil
}

// owned returns key's record when token holds its lease; s.mu is held.
func (s *scriptStore) owned(key, token string) (Record, bool) {
	rec, ok := s.recs[key]
	return rec, ok && rec.State == StateInProgress && rec.Token == token
}

func (s *scriptStore) Get(_ context.Context, key string) (Record, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.recs[key]
	return rec, ok, nil
}

// TestEventFields checks that every event carries the store operation and
// its duration, the handler's duration on the event ending an execution,
// method, route and scoped key, and that acquired events minus ended events
// count the executions in progress.
func TestEventFields(t *testing.T) {
	const delay = 5 * time.Millisecond
	store := newScriptStore(delay)
	events := make(chan Event, 64)
	e, err := New(store, WithStoreTimeout(20*time.Millisecond), WithLease(300*time.Millisecond),
		WithCompletionRetry(0), WithLogger(slog.New(slog.DiscardHandler)),
		WithEventHook(func(_ context.Context, ev Event) { events <- ev }))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.Close(context.Background()) }()

	inProgress := 0
	next := func(want EventKind) Event {
		t.Helper()
		select {
		case ev := <-events:
			if ev.Kind != want {
				t.Fatalf("event %s (op %s, err %v), want %s", ev.Kind, ev.Op, ev.Err, want)
			}
			if ev.Kind == EventAcquired {
				inProgress++
			}
			if ev.Ended {
				inProgress--
			}
			return ev
		case <-time.After(10 * time.Second):
			t.Fatalf("no %s event", want)
			return Event{}
		}
	}
	req := func(key, body string) *Request {
		return &Request{Method: "POST", Route: "/p/:id", Path: "/p/1", Keys: []string{key}, Principal: "u1", Body: []byte(body)}
	}
	check := func(ev Event, op StoreOp, ended bool) {
		t.Helper()
		if ev.Op != op || ev.Ended != ended {
			t.Errorf("%s: op %s ended %v, want op %s ended %v", ev.Kind, ev.Op, ev.Ended, op, ended)
		}
		if op != 0 && ev.StoreDuration < delay {
			t.Errorf("%s: store duration %v, want >= %v", ev.Kind, ev.StoreDuration, delay)
		}
		if op == 0 && ev.StoreDuration != 0 {
			t.Errorf("%s: store duration %v without a store call", ev.Kind, ev.StoreDuration)
		}
		if !ended && ev.HandlerDuration != 0 {
			t.Errorf("%s: handler duration %v on an event that ends no execution", ev.Kind, ev.HandlerDuration)
		}
		if ev.Method != "POST" || ev.Route != "/p/:id" {
			t.Errorf("%s: method %q route %q", ev.Kind, ev.Method, ev.Route)
		}
	}
	const handlerTime = 20 * time.Millisecond
	run := func(x *Execution, finish func()) {
		time.Sleep(handlerTime) // the handler's work: a lower bound for HandlerDuration
		finish()
	}

	// Fresh: acquired, then completed with both durations.
	x, _ := e.Begin(context.Background(), req("k1", "a"))
	ev := next(EventAcquired)
	check(ev, OpAcquire, false)
	if ev.Key != ScopedKey("u1", "POST", "/p/:id", "k1") {
		t.Errorf("acquired key %q is not the scoped key", ev.Key)
	}
	run(x, func() { x.Finish(201, nil) })
	ev = next(EventCompleted)
	check(ev, OpComplete, true)
	if ev.HandlerDuration < handlerTime || ev.Status != 201 {
		t.Errorf("completed: handler duration %v status %d, want >= %v and 201", ev.HandlerDuration, ev.Status, handlerTime)
	}

	// Replay, mismatch, rejected: decided by one acquire, or by none.
	e.Begin(context.Background(), req("k1", "a"))
	check(next(EventReplayed), OpAcquire, false)
	e.Begin(context.Background(), req("k1", "b"))
	check(next(EventMismatch), OpAcquire, false)
	e.Begin(context.Background(), req("", "a"))
	check(next(EventRejected), 0, false)

	// Conflict while k2 runs; its handler fails and the key is released.
	x, _ = e.Begin(context.Background(), req("k2", "a"))
	next(EventAcquired)
	e.Begin(context.Background(), req("k2", "a"))
	check(next(EventConflict), OpAcquire, false)
	run(x, x.Fail)
	ev = next(EventReleased)
	check(ev, OpRelease, true)
	if ev.HandlerDuration < handlerTime {
		t.Errorf("released: handler duration %v, want >= %v", ev.HandlerDuration, handlerTime)
	}

	// A failed renewal is reported while the handler runs, not as its end.
	store.failNext(OpExtend, errors.New("extend down"))
	x, _ = e.Begin(context.Background(), req("k3", "a"))
	next(EventAcquired)
	check(next(EventStoreError), OpExtend, false)
	// The completion is refused: lease lost, which ends the execution.
	store.failNext(OpComplete, ErrNotOwner)
	x.Finish(200, nil)
	check(next(EventLeaseLost), OpComplete, true)

	// A failed release ends the execution; the background release that
	// follows reports the same key, method and route, without ending anything.
	store.failNext(OpRelease, errors.New("release down"))
	x, _ = e.Begin(context.Background(), req("k4", "a"))
	next(EventAcquired)
	x.Fail()
	check(next(EventStoreError), OpRelease, true)
	ev = next(EventReleased)
	check(ev, OpRelease, false)
	if ev.Key != ScopedKey("u1", "POST", "/p/:id", "k4") {
		t.Errorf("background release key %q is not the scoped key", ev.Key)
	}

	// A failed acquire reaches no handler.
	store.failNext(OpAcquire, errors.New("acquire down"))
	e.Begin(context.Background(), req("k5", "a"))
	check(next(EventStoreError), OpAcquire, false)

	// Without a route template the scope uses the path; events leave it out.
	noRoute := &Request{Method: "POST", Path: "/p/8127", Keys: []string{"k6"}, Principal: "u1"}
	x, _ = e.Begin(context.Background(), noRoute)
	if ev := next(EventAcquired); ev.Route != "" || ev.Key != ScopedKey("u1", "POST", "/p/8127", "k6") {
		t.Errorf("acquired without a route template: route %q key %q; want no route and the path-scoped key", ev.Route, ev.Key)
	}
	x.Finish(200, nil)
	next(EventCompleted)

	if inProgress != 0 {
		t.Errorf("acquired - ended = %d after every execution ended, want 0", inProgress)
	}
	if OpAcquire.String() != "acquire" || OpExtend.String() != "extend" || StoreOp(0).String() != "" || StoreOp(99).String() != "unknown" {
		t.Error("StoreOp names are wrong")
	}
}
