package idem

import "context"

type infoKey struct{}

// Info is what idem tells handlers and middleware through the request context.
type Info struct {
	// Key is the scoped, hashed idempotency key (64 hex characters), the same
	// for every retry: fit to forward as a downstream idempotency key.
	Key string
	// Replayed is true when the response is a stored one being replayed
	// (seen by middleware outside idem; handlers run only when it is false).
	Replayed bool

	unit   Unit       // set by Execution.WithInfo for Transactional stores
	engine *Engine    // the engine whose execution this is, set by Execution.WithInfo
	exec   *Execution // the execution, for Step; set by Execution.WithInfo
}

// ContextWithInfo returns ctx carrying info. Adapters call it; a client can't
// set it, unlike a request header.
func ContextWithInfo(ctx context.Context, info Info) context.Context {
	if info.Replayed && info.Key == "" && info.unit == nil { // every replay: share one
		return context.WithValue(ctx, infoKey{}, replayedInfo)
	}
	p := new(Info) // not &info: the parameter would move to the heap on every call
	*p = info
	return context.WithValue(ctx, infoKey{}, p)
}

// replayedInfo is the Info of every replay; readers get copies.
var replayedInfo = &Info{Replayed: true}

// InfoKey returns the context key under which [ContextWithInfo] and
// [Execution.WithInfo] store what [InfoFromContext] reads. Adapters of
// frameworks whose request context answers Value from a store of its own
// (Fiber v3: Ctx.Value reads the request's Locals, not Ctx.Context()) copy
// ctx.Value(InfoKey()) there, so that InfoFromContext works on the
// framework's context too.
func InfoKey() any { return infoKey{} }

// InfoFromContext returns the Info set by an adapter, ok = false when the
// request was not handled by idem (method not covered, or fail-open).
func InfoFromContext(ctx context.Context) (info Info, ok bool) {
	p, ok := ctx.Value(infoKey{}).(*Info)
	if !ok {
		return Info{}, false
	}
	return *p, true
}

// UnitFromContext returns the [Unit] of the execution whose handler ctx
// belongs to, or nil when the store is not [Transactional] or the request
// is not an execution (not covered, replayed, fail-open). Stores wrap it
// in a typed helper (e.g. pgstore.Tx).
func UnitFromContext(ctx context.Context) Unit {
	if p, ok := ctx.Value(infoKey{}).(*Info); ok {
		return p.unit
	}
	return nil
}

// infoCtx is context.WithValue(parent, infoKey{}, info) held in an
// [Execution], saving an allocation per request.
type infoCtx struct {
	context.Context
	info *Info
}

func (c *infoCtx) Value(key any) any {
	if key == (infoKey{}) {
		return c.info
	}
	return c.Context.Value(key)
}
