package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	idem "github.com/idemkit/idem/core"
)

// Call names a kind of store call a [FaultStore] counts and can break.
type Call string

// The calls a [FaultStore] counts: [idem.Store], [idem.Extender] and
// [idem.Keeper] methods, and a [idem.Unit]'s Complete and Release (counted
// as CallComplete and CallRelease: they are the execution's completion and
// release).
const (
	CallAcquire  Call = "acquire" // Acquire and AcquireKeep
	CallExtend   Call = "extend"
	CallComplete Call = "complete"
	CallRelease  Call = "release"
	CallGet      Call = "get"
	CallResolve  Call = "resolve"
)

// Fault is what a [FaultStore] does to a call.
type Fault uint8

const (
	// FaultFail returns [ErrInjected] without calling the store.
	FaultFail Fault = iota + 1
	// FaultDelay calls the store after the FaultStore's delay: when the
	// caller's context ends first, the caller gets its error at once and
	// the call still reaches the store later (a request that timed out
	// in flight; [FaultStore.Wait] waits for it).
	FaultDelay
	// FaultLoseReply calls the store, then returns [ErrInjected]: the
	// store acted, the caller never learns it (a reply lost after the
	// commit).
	FaultLoseReply
)

// Faults lists every [Fault], for enumerations.
var Faults = []Fault{FaultFail, FaultDelay, FaultLoseReply}

// String returns "fail", "delay" or "lose-reply".
func (f Fault) String() string {
	switch f {
	case FaultFail:
		return "fail"
	case FaultDelay:
		return "delay"
	case FaultLoseReply:
		return "lose-reply"
	}
	return "none"
}

// ErrInjected is the error a [FaultStore] returns for a call it fails or
// whose reply it loses: a system failure, as a store's network error.
var ErrInjected = errors.New("storetest: injected fault")

// Injection breaks the N-th call (from 1) of kind Call with Fault.
type Injection struct {
	Call  Call
	N     int
	Fault Fault
}

func (i Injection) String() string { return fmt.Sprintf("%s #%d %v", i.Call, i.N, i.Fault) }

// FaultStore wraps a store and breaks chosen calls, deterministically by
// their rank: the N-th Extend, the first Complete. A test first runs an
// execution through a FaultStore without injections to count its calls
// ([FaultStore.Calls]), then runs it again once per call and [Fault], to
// check the engine's promises at every crash point (tests/robustness/crash
// does, for memstore and Redis).
//
// [NewFaultStore] returns it as an [idem.Store] that also implements
// [idem.Extender], [idem.Keeper] and [idem.Transactional] when the wrapped
// store does. It never reports [idem.LocalStore]: its faults are those of
// a store behind a network, so the engine renews leases and times its
// calls out as it does for one.
type FaultStore struct {
	inner idem.Store
	delay time.Duration

	mu       sync.Mutex
	plan     map[Call]map[int]Fault
	calls    map[Call]int
	injected []Injection
	keys     []string
	late     int        // delayed calls not yet landed
	landed   *sync.Cond // on mu: late reached 0
}

// NewFaultStore wraps inner: calls hit by an injection of plan get its
// fault; FaultDelay waits delay. It returns the wrapper as an
// [idem.Store] with inner's optional interfaces, and the FaultStore to
// read its counts from.
func NewFaultStore(inner idem.Store, delay time.Duration, plan ...Injection) (idem.Store, *FaultStore) {
	f := &FaultStore{inner: inner, delay: delay, plan: map[Call]map[int]Fault{}, calls: map[Call]int{}}
	f.landed = sync.NewCond(&f.mu)
	for _, in := range plan {
		if f.plan[in.Call] == nil {
			f.plan[in.Call] = map[int]Fault{}
		}
		f.plan[in.Call][in.N] = in.Fault
	}
	ext, _ := inner.(idem.Extender)
	keep, _ := inner.(idem.Keeper)
	tx, _ := inner.(idem.Transactional)
	var e idem.Extender
	var k idem.Keeper
	var u idem.Transactional
	if ext != nil {
		e = faultExtender{f, ext}
	}
	if keep != nil {
		k = faultKeeper{f, keep}
	}
	if tx != nil {
		u = faultTx{f, tx}
	}
	switch {
	case e != nil && k != nil && u != nil:
		return struct {
			*FaultStore
			idem.Extender
			idem.Keeper
			idem.Transactional
		}{f, e, k, u}, f
	case e != nil && k != nil:
		return struct {
			*FaultStore
			idem.Extender
			idem.Keeper
		}{f, e, k}, f
	case e != nil && u != nil:
		return struct {
			*FaultStore
			idem.Extender
			idem.Transactional
		}{f, e, u}, f
	case k != nil && u != nil:
		return struct {
			*FaultStore
			idem.Keeper
			idem.Transactional
		}{f, k, u}, f
	case e != nil:
		return struct {
			*FaultStore
			idem.Extender
		}{f, e}, f
	case k != nil:
		return struct {
			*FaultStore
			idem.Keeper
		}{f, k}, f
	case u != nil:
		return struct {
			*FaultStore
			idem.Transactional
		}{f, u}, f
	}
	return f, f
}

// Calls returns how many calls of each kind the store received so far.
func (f *FaultStore) Calls() map[Call]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[Call]int, len(f.calls))
	for c, n := range f.calls {
		out[c] = n
	}
	return out
}

// Injected returns the injections that hit a call, in order.
func (f *FaultStore) Injected() []Injection {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Injection(nil), f.injected...)
}

// Keys returns the keys acquired through the store, in order, once each.
func (f *FaultStore) Keys() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.keys...)
}

// Wait waits for the delayed calls whose callers gave up to reach the
// store (calls may go on meanwhile: an engine's renewal under way).
func (f *FaultStore) Wait() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for f.late > 0 {
		f.landed.Wait()
	}
}

// next counts a call of kind c and returns its fault (0 for none).
func (f *FaultStore) next(c Call) Fault {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[c]++
	n := f.calls[c]
	fault := f.plan[c][n]
	if fault != 0 {
		f.injected = append(f.injected, Injection{c, n, fault})
	}
	return fault
}

// do runs call, of kind c, under its fault. call must use the context it
// is given.
func (f *FaultStore) do(ctx context.Context, c Call, call func(ctx context.Context) error) error {
	switch f.next(c) {
	case FaultFail:
		return ErrInjected
	case FaultLoseReply:
		_ = call(ctx)
		return ErrInjected
	case FaultDelay:
		landed := make(chan error, 1)
		f.mu.Lock()
		f.late++
		f.mu.Unlock()
		go func() {
			time.Sleep(f.delay)
			landed <- call(context.WithoutCancel(ctx))
			f.mu.Lock()
			if f.late--; f.late == 0 {
				f.landed.Broadcast()
			}
			f.mu.Unlock()
		}()
		select {
		case err := <-landed:
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return call(ctx)
}

func (f *FaultStore) seen(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, k := range f.keys {
		if k == key {
			return
		}
	}
	f.keys = append(f.keys, key)
}

// read runs call, of kind c, which returns a record and a flag, under its
// fault; after a lost reply or a delayed call whose caller gave up, the
// record and flag are the zero values.
func (f *FaultStore) read(ctx context.Context, c Call, call func(ctx context.Context) (idem.Record, bool, error)) (idem.Record, bool, error) {
	var rec idem.Record
	var ok bool
	var mu sync.Mutex // a delayed call may write after the caller returned
	err := f.do(ctx, c, func(ctx context.Context) error {
		r, o, err := call(ctx)
		mu.Lock()
		rec, ok = r, o
		mu.Unlock()
		return err
	})
	if err != nil {
		return idem.Record{}, false, err
	}
	mu.Lock()
	defer mu.Unlock()
	return rec, ok, nil
}

// Acquire implements [idem.Store].
func (f *FaultStore) Acquire(ctx context.Context, key, token, fingerprint string, lease time.Duration) (idem.Record, bool, error) {
	f.seen(key)
	return f.read(ctx, CallAcquire, func(ctx context.Context) (idem.Record, bool, error) {
		return f.inner.Acquire(ctx, key, token, fingerprint, lease)
	})
}

// Complete implements [idem.Store].
func (f *FaultStore) Complete(ctx context.Context, key, token string, response []byte, retention time.Duration) error {
	response = append([]byte(nil), response...) // a delayed call reads it after the caller returned
	return f.do(ctx, CallComplete, func(ctx context.Context) error {
		return f.inner.Complete(ctx, key, token, response, retention)
	})
}

// Release implements [idem.Store].
func (f *FaultStore) Release(ctx context.Context, key, token string) error {
	return f.do(ctx, CallRelease, func(ctx context.Context) error { return f.inner.Release(ctx, key, token) })
}

// Get implements [idem.Store].
func (f *FaultStore) Get(ctx context.Context, key string) (idem.Record, bool, error) {
	return f.read(ctx, CallGet, func(ctx context.Context) (idem.Record, bool, error) { return f.inner.Get(ctx, key) })
}

type faultExtender struct {
	f     *FaultStore
	inner idem.Extender
}

func (e faultExtender) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	return e.f.do(ctx, CallExtend, func(ctx context.Context) error { return e.inner.Extend(ctx, key, token, lease) })
}

type faultKeeper struct {
	f     *FaultStore
	inner idem.Keeper
}

func (k faultKeeper) AcquireKeep(ctx context.Context, key, token, fingerprint string, lease time.Duration, keep idem.Keep) (idem.Record, bool, error) {
	k.f.seen(key)
	return k.f.read(ctx, CallAcquire, func(ctx context.Context) (idem.Record, bool, error) {
		return k.inner.AcquireKeep(ctx, key, token, fingerprint, lease, keep)
	})
}

func (k faultKeeper) Resolve(ctx context.Context, key string, response []byte, retention time.Duration) error {
	response = append([]byte(nil), response...)
	return k.f.do(ctx, CallResolve, func(ctx context.Context) error { return k.inner.Resolve(ctx, key, response, retention) })
}

type faultTx struct {
	f     *FaultStore
	inner idem.Transactional
}

func (t faultTx) Unit(key, token string) idem.Unit { return faultUnit{t.f, t.inner.Unit(key, token)} }

type faultUnit struct {
	f     *FaultStore
	inner idem.Unit
}

func (u faultUnit) Complete(ctx context.Context, response []byte, retention time.Duration) error {
	response = append([]byte(nil), response...)
	return u.f.do(ctx, CallComplete, func(ctx context.Context) error { return u.inner.Complete(ctx, response, retention) })
}

func (u faultUnit) Release(ctx context.Context) error {
	return u.f.do(ctx, CallRelease, func(ctx context.Context) error { return u.inner.Release(ctx) })
}
