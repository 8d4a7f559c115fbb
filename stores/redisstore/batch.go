package redisstore

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// flushSlots is how many flushes of one store may be in flight at once
// for client c: a command sent inline by a caller that found a slot free,
// or a pipeline of queued commands sent by one of their callers. It is
// the client's connection pool size (go-redis: 10 per GOMAXPROCS for a
// Client, 5 per GOMAXPROCS per node for a ClusterClient, by default), so
// that the store batches only what the plain client would queue for a
// connection: a flight stuck on a broken connection until its context
// ends holds one slot, as it would hold one pooled connection, and never
// stalls the lease renewals of other calls while connections are free.
func flushSlots(c redis.UniversalClient) int {
	n := 0
	switch c := c.(type) {
	case *redis.Client:
		n = c.Options().PoolSize
	case *redis.ClusterClient:
		n = c.Options().PoolSize
	}
	if n <= 0 {
		n = 10 * runtime.GOMAXPROCS(0)
	}
	return n
}

// batcher groups the per-record commands of concurrent calls into
// pipelines, on the callers' own goroutines (group commit): a caller that
// finds a flush slot free sends its command at once with Process, exactly
// as the plain client does; a caller that finds every slot taken queues
// its command and waits. When a flush ends, its caller hands the slot to
// one queued caller (the one whose context ends last), which sends every
// queued command in one pipeline, after dropping each one whose context
// already ended: that command returns its context's error and is never
// sent. It starts no goroutine.
type batcher struct {
	c     redis.UniversalClient
	max   int // flushSlots(c)
	mu    sync.Mutex
	busy  int       // flushes in flight, at most max
	queue []*queued // commands waiting for a flush, in arrival order
}

// States of a queued command (queued.state), under batcher.mu.
const (
	waiting = iota // in the queue
	leading        // taken out of the queue to flush the queue
	taken          // in a pipeline being sent
	replied        // its pipeline returned: cmd holds its reply or error
	dropped        // its context ended before a flush took it: never sent
)

// queued is a command waiting for a flush.
type queued struct {
	ctx      context.Context
	cmd      redis.Cmder
	deadline time.Time // ctx's, zero for none
	state    int
	wake     chan struct{} // signalled once: leading or replied
}

// send runs cmd, inline or in a batch (see batcher). It returns a non-nil
// error only when ctx ended first: a command dropped before it was sent
// returns ctx's error; one whose pipeline went to go-redis before ctx
// ended returns it wrapped, and may run on the server, as a command whose
// reply a timed-out plain client stops reading does. cmd must not be read
// then. Otherwise cmd holds its reply or error, as after Process.
func (b *batcher) send(ctx context.Context, cmd redis.Cmder) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	if b.busy < b.max {
		b.busy++
		b.mu.Unlock()
		_ = b.c.Process(ctx, cmd)
		b.mu.Lock()
		b.handOff()
		b.mu.Unlock()
		return nil
	}
	// A taken command whose caller stopped waiting may be written after
	// the call returned, when the caller may have reused the memory of its
	// arguments: a []byte argument (a caller's response or step result;
	// the store's own buffers are strings it never reuses) goes as a copy.
	args := cmd.Args()
	for i, a := range args {
		if p, ok := a.([]byte); ok {
			args[i] = bytes.Clone(p)
		}
	}
	q := &queued{ctx: ctx, cmd: cmd, wake: make(chan struct{}, 1)}
	q.deadline, _ = ctx.Deadline()
	b.queue = append(b.queue, q)
	b.mu.Unlock()

	select {
	case <-q.wake:
	case <-ctx.Done():
	}
	b.mu.Lock()
	switch q.state {
	case leading:
		return b.lead(q) // unlocks b.mu
	case waiting:
		b.queue = remove(b.queue, q)
		fallthrough
	case dropped:
		b.mu.Unlock()
		return ctx.Err()
	case taken:
		b.mu.Unlock()
		return fmt.Errorf("%w (the command was sent; its reply was not awaited)", ctx.Err())
	}
	b.mu.Unlock()
	return nil // replied
}

// lead flushes the queue for q, which holds a flush slot; b.mu is held
// and lead unlocks it. When q's context ended, q is dropped and passes
// the slot on. The pipeline takes every queued command whose context has
// not ended and ends no later than q's (which ends last, see handOff):
// commands that came later, with a later deadline, stay queued for the
// next flush. The pipeline runs under q's context without its
// cancellation, until q's deadline: a member's end, q's included, never
// cuts the others' replies short.
func (b *batcher) lead(q *queued) error {
	if err := q.ctx.Err(); err != nil {
		q.state = dropped
		b.handOff()
		b.mu.Unlock()
		return err
	}
	batch := []*queued{q}
	rest := b.queue[:0]
	for _, m := range b.queue {
		switch {
		case m.ctx.Err() != nil:
			m.state = dropped // its caller returns its context's error
		case later(m.deadline, q.deadline):
			rest = append(rest, m)
		default:
			m.state = taken
			batch = append(batch, m)
		}
	}
	clear(b.queue[len(rest):])
	b.queue = rest
	b.mu.Unlock()

	if len(batch) == 1 {
		_ = b.c.Process(q.ctx, q.cmd)
	} else {
		ctx := context.WithoutCancel(q.ctx)
		if !q.deadline.IsZero() {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, q.deadline)
			defer cancel()
		}
		pipe := b.c.Pipeline()
		for _, m := range batch {
			_ = pipe.Process(ctx, m.cmd) // queues m.cmd
		}
		_, _ = pipe.Exec(ctx) // every command holds its own reply or error
	}

	b.mu.Lock()
	for _, m := range batch[1:] {
		m.state = replied
		m.wake <- struct{}{}
	}
	b.handOff()
	b.mu.Unlock()
	return nil
}

// handOff passes a flush slot that ends, under b.mu, to the queued
// command whose context ends last (no deadline counts as last), or frees
// it when none waits.
func (b *batcher) handOff() {
	if len(b.queue) == 0 {
		b.busy--
		return
	}
	i := 0
	for j, m := range b.queue[1:] {
		if later(m.deadline, b.queue[i].deadline) {
			i = j + 1
		}
	}
	q := b.queue[i]
	b.queue = remove(b.queue, q)
	q.state = leading
	q.wake <- struct{}{}
}

// later reports whether deadline a ends after b (the zero time: never).
func later(a, b time.Time) bool {
	if a.IsZero() {
		return !b.IsZero()
	}
	return !b.IsZero() && a.After(b)
}

// remove returns queue without q, in order.
func remove(queue []*queued, q *queued) []*queued {
	for i, m := range queue {
		if m == q {
			copy(queue[i:], queue[i+1:])
			queue[len(queue)-1] = nil
			return queue[:len(queue)-1]
		}
	}
	return queue
}
