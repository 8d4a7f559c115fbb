package idem

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// deadlines gives store calls their deadline ([WithStoreTimeout]) without
// a context, a timer and a Done channel of their own: calls that start
// within one slot (a sixteenth of the timeout) share one deadline context,
// which ends the timeout after the slot began. Every call is thus bounded
// by the store timeout, and gets at least fifteen sixteenths of it.
type deadlines struct {
	timeout time.Duration
	slot    time.Duration
	cur     atomic.Pointer[deadlineSlot]
	mu      sync.Mutex // serialises making a new slot
}

// deadlineSlot is the context shared by the store calls started in
// [start, start+slot): context.WithDeadline(context.Background(),
// start+timeout). Its timer cancels it; it is never cancelled sooner.
type deadlineSlot struct {
	start time.Time
	ctx   context.Context
}

func newDeadlines(timeout time.Duration) *deadlines {
	return &deadlines{timeout: timeout, slot: max(timeout/16, 1)}
}

// at returns the deadline context of a call starting at now.
func (d *deadlines) at(now time.Time) context.Context {
	if s := d.cur.Load(); s != nil && now.Sub(s.start) < d.slot && !now.Before(s.start) {
		return s.ctx
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if s := d.cur.Load(); s != nil && now.Sub(s.start) < d.slot && !now.Before(s.start) {
		return s.ctx
	}
	ctx, cancel := context.WithDeadline(context.Background(), now.Add(d.timeout))
	// Only the deadline ends ctx: cancelling it sooner would end calls
	// under way, and a timer of our own could run before the deadline's
	// (both start a goroutine) and end them with Canceled instead of
	// DeadlineExceeded. cancel runs once ctx is done, a no-op then.
	context.AfterFunc(ctx, cancel)
	d.cur.Store(&deadlineSlot{start: now, ctx: ctx})
	return ctx
}

// storeCtx is the context of one store call: the values of parent (a
// context that is never cancelled: Done is nil), and the deadline and
// cancellation of a shared deadline slot. Value answers the slot's own
// internal key first, so that context.AfterFunc and contexts derived from
// a storeCtx register with the slot's cancellation instead of starting a
// goroutine each (the slot holds no other values).
type storeCtx struct {
	parent context.Context
	slot   context.Context
}

func (c *storeCtx) Deadline() (time.Time, bool) { return c.slot.Deadline() }

func (c *storeCtx) Done() <-chan struct{} { return c.slot.Done() }

func (c *storeCtx) Err() error { return c.slot.Err() }

func (c *storeCtx) Value(key any) any {
	if v := c.slot.Value(key); v != nil {
		return v
	}
	return c.parent.Value(key)
}

// noCancel is the cancel function of a call context that needs none.
func noCancel() {}

// storeCall returns the context of one store call under ctx, bounded by
// the store timeout, and its cancel function. A ctx that can be cancelled
// (a request's) gets a context.WithTimeout, which follows both; one that
// cannot (Background, or an execution's detached context) gets a
// [storeCtx] on a shared deadline: one allocation instead of four or five.
func (e *Engine) storeCall(ctx context.Context) (context.Context, context.CancelFunc) {
	if ctx.Done() != nil {
		return context.WithTimeout(ctx, e.cfg.storeTimeout)
	}
	return &storeCtx{parent: ctx, slot: e.deadlines.at(time.Now())}, noCancel
}
