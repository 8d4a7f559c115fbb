package idem

import (
	"container/heap"
	"errors"
	"sync"
	"time"
)

// renewStart is the origin of renewClock.
var renewStart = time.Now()

// renewClock is the monotonic time since renewStart: 8 bytes in each
// Execution instead of a time.Time's 24.
func renewClock() time.Duration { return time.Since(renewStart) }

// renewIdle is how long the renewal goroutine stays with no execution to
// renew before it exits (it starts again with the next one); after
// [Engine.Close] it exits as soon as none is left.
const renewIdle = 100 * time.Millisecond

// renewals schedules the lease renewals ([Extender]) of an engine's running
// executions: one goroutine and one timer for all of them, instead of a
// timer (and its closure) per execution. Executions wait in a heap ordered
// by their next renewal; each renewal due runs in a goroutine of its own,
// so that a slow store call delays no other. The goroutine runs while
// executions are registered, and for up to two renewIdle after the last.
type renewals struct {
	mu      sync.Mutex
	h       renewHeap
	running bool          // the goroutine runs
	wakeAt  time.Duration // when the goroutine wakes up by itself (renewClock; 0: not waiting)
	wake    chan struct{} // wakes it sooner (capacity 1)
	closed  bool          // Close was called: exit when idle
}

// add registers x for renewal every lease/3 from now, until remove.
func (r *renewals) add(x *Execution) {
	r.mu.Lock()
	defer r.mu.Unlock()
	x.due = renewClock() + x.pol.lease/3
	heap.Push(&r.h, x)
	switch {
	case !r.running:
		if r.wake == nil {
			r.wake = make(chan struct{}, 1)
		}
		r.running = true
		go r.run(x.e)
	case r.wakeAt != 0 && x.due < r.wakeAt:
		r.signal()
	}
}

// remove stops x's renewal; a renewal under way still ends.
func (r *renewals) remove(x *Execution) {
	r.mu.Lock()
	if x.slot >= 0 {
		heap.Remove(&r.h, x.slot)
	}
	r.mu.Unlock()
}

// queued reports whether x is still registered (remove not called).
func (r *renewals) queued(x *Execution) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return x.slot >= 0
}

// close makes the goroutine exit as soon as no execution is left.
func (r *renewals) close() {
	r.mu.Lock()
	r.closed = true
	if r.running {
		r.signal()
	}
	r.mu.Unlock()
}

// signal wakes the goroutine; r.mu is held.
func (r *renewals) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// run starts the renewals due, then sleeps until the next one, a new
// earlier one, or close.
func (r *renewals) run(e *Engine) {
	t := time.NewTimer(renewIdle)
	defer t.Stop()
	idleSince := time.Duration(-1)
	for {
		r.mu.Lock()
		now := renewClock()
		for len(r.h) > 0 && r.h[0].due <= now {
			x := r.h[0]
			x.due = now + x.pol.lease/3
			heap.Fix(&r.h, 0)
			go e.renew(x)
		}
		if len(r.h) == 0 {
			if idleSince < 0 {
				idleSince = now
			}
			if r.closed || now-idleSince >= renewIdle {
				r.running = false
				r.wakeAt = 0
				r.mu.Unlock()
				return
			}
			r.wakeAt = idleSince + renewIdle
		} else {
			// Wake at least every renewIdle: executions that end are not
			// signalled, so an emptied heap is noticed then.
			idleSince = -1
			r.wakeAt = min(r.h[0].due, now+renewIdle)
		}
		d := r.wakeAt - now
		r.mu.Unlock()
		t.Reset(d)
		select {
		case <-t.C:
		case <-r.wake:
		}
	}
}

// renew extends x's lease once, bounded by the store timeout (below a
// renewal period: the lease is at least 4 store timeouts). A lost lease
// ends x's renewals. A failure of a renewal that was under way when x's
// renewals ended (its completion stored or its key released) reports
// nothing: the lease it would have extended is no longer needed.
func (e *Engine) renew(x *Execution) {
	start := time.Now()
	ctx, cancel := e.storeCall(x.ctx)
	err := e.extender.Extend(ctx, x.ev.Key, x.token, x.pol.lease)
	cancel()
	ev := x.ev
	ev.Op, ev.StoreDuration = OpExtend, time.Since(start)
	switch {
	case errors.Is(err, ErrNotOwner):
		e.renewals.remove(x)
		x.mu.Lock()
		finished := x.finished
		x.mu.Unlock()
		if !finished { // after Finish or Fail, the record is legitimately no longer ours
			e.emitErr(x.ctx, ev, EventLeaseLost, err, "idem: lease lost while the handler runs")
		}
	case err != nil && !e.renewals.queued(x):
		// x ended while this renewal was under way: nothing to report
	case err != nil:
		if x.renewFailed.Swap(true) { // logged once per execution; every failure is an event
			ev.Kind, ev.Err = EventStoreError, err
			e.emit(x.ctx, ev)
		} else {
			e.emitErr(x.ctx, ev, EventStoreError, err, "idem: lease renewal failed; retrying (further failures of this execution are reported as events only)")
		}
	}
}

// renewHeap is a min-heap of executions by due; each knows its index
// (slot, -1 when out of the heap), so that remove is O(log n).
type renewHeap []*Execution

func (h renewHeap) Len() int           { return len(h) }
func (h renewHeap) Less(i, j int) bool { return h[i].due < h[j].due }
func (h renewHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].slot, h[j].slot = i, j
}

func (h *renewHeap) Push(v any) {
	x := v.(*Execution)
	x.slot = len(*h)
	*h = append(*h, x)
}

func (h *renewHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = nil
	x.slot = -1
	*h = old[:len(old)-1]
	return x
}
