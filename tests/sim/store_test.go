package sim

import (
	"context"
	"errors"
	"time"

	idem "github.com/idemkit/idem/core"
)

// Errors the faulty store answers with.
var (
	errStoreDown    = errors.New("sim: store unreachable (nothing applied)")
	errAnswerLost   = errors.New("sim: store applied the call, its answer was lost")
	errInstanceDied = errors.New("sim: this instance is dead")
)

// store is one instance's connection to the shared memstore: it applies
// every call under the world's lock (one atomic step of the simulation),
// keeps the shadow of each key (who holds it, until when) to check the
// fencing of every write that succeeded, and injects the faults the seed
// chooses: errors before or after applying, timeouts (the call waits for
// its context's deadline, then fails, or is applied late, after the
// caller gave up), a crash of the instance right after applying, and the
// instance's stalls and death. It hides memstore's LocalStore, so the
// engine takes real leases, renews them and lets them lapse. inst is nil
// for the operator's connection, which has no faults.
type store struct {
	w    *world
	inst *instance
}

type fault uint8

const (
	faultNone fault = iota
	faultBefore
	faultAfter
	faultTimeout
	faultLate
	faultCrashAfter
)

// call runs apply (the memstore call and its shadow bookkeeping, made
// under the world's lock) with the fault the seed picks for this call.
func (s *store) call(ctx context.Context, op, key, token string, mutating bool, apply func(ctx context.Context) error) error {
	w := s.w
	if s.inst == nil {
		return w.apply(ctx, op, key, token, mutating, apply)
	}
	s.inst.waitStall()
	// Calls that reach the store at one virtual instant (an instance
	// waking from a stall, a shared deadline) are spread over the next
	// microsecond by what they are, not by which goroutine runs first.
	time.Sleep(time.Duration(1 + w.roll(1000, "arrive", op, key)))
	if s.inst.isDead() {
		return errInstanceDied
	}
	f := w.storeFault(op, key)
	switch f {
	case faultBefore:
		w.count("fault:store-error-before")
		return errStoreDown
	case faultAfter:
		w.count("fault:store-error-after")
		if err := w.apply(ctx, op, key, token, mutating, apply); err != nil {
			return err
		}
		return errAnswerLost
	case faultTimeout, faultLate:
		if ctx.Done() == nil {
			return errStoreDown
		}
		<-ctx.Done()
		if f == faultLate {
			time.Sleep(time.Duration(1 + w.roll(1000, "late", op, key)))
			w.count("fault:store-late-apply")
			_ = w.apply(context.WithoutCancel(ctx), op, key, token, mutating, apply)
		} else {
			w.count("fault:store-timeout")
		}
		return ctx.Err()
	case faultCrashAfter:
		w.count("fault:crash-after-store-call")
		err := w.apply(ctx, op, key, token, mutating, apply)
		s.inst.crash("after store call " + op)
		if err != nil {
			return err
		}
		return errInstanceDied
	}
	return w.apply(ctx, op, key, token, mutating, apply)
}

func (s *store) Acquire(ctx context.Context, key, token, fp string, lease time.Duration) (idem.Record, bool, error) {
	return s.AcquireKeep(ctx, key, token, fp, lease, idem.Keep{})
}

func (s *store) AcquireKeep(ctx context.Context, key, token, fp string, lease time.Duration, keep idem.Keep) (rec idem.Record, acquired bool, err error) {
	err = s.call(ctx, "acquire", key, token, true, func(ctx context.Context) error {
		var err error
		rec, acquired, err = s.w.mem.AcquireKeep(ctx, key, token, fp, lease, keep)
		if err == nil && acquired {
			s.w.acquired(key, token, lease, rec.Token == "", "acquire")
		}
		if err == nil && !acquired && s.w.sh(key).released {
			s.w.violate("key %d: acquire refused (%v record) on a released key", s.w.keyIdx[key], rec.State)
		}
		return err
	})
	if err != nil {
		return idem.Record{}, false, err
	}
	return rec, acquired, nil
}

func (s *store) Complete(ctx context.Context, key, token string, response []byte, retention time.Duration) error {
	return s.call(ctx, "complete", key, token, true, func(ctx context.Context) error {
		err := s.w.mem.Complete(ctx, key, token, response, retention)
		if err == nil {
			s.w.wrote(key, token, "complete", true)
			s.w.sh(key).holder = ""
		}
		return err
	})
}

func (s *store) Release(ctx context.Context, key, token string) error {
	return s.call(ctx, "release", key, token, true, func(ctx context.Context) error {
		err := s.w.mem.Release(ctx, key, token)
		if err == nil {
			s.w.wrote(key, token, "release", true)
			sh := s.w.sh(key)
			sh.holder, sh.released = "", true
			sh.incarnation++
			s.w.countLocked("release")
		}
		return err
	})
}

func (s *store) Get(ctx context.Context, key string) (rec idem.Record, found bool, err error) {
	err = s.call(ctx, "get", key, "", false, func(ctx context.Context) error {
		var err error
		rec, found, err = s.w.mem.Get(ctx, key)
		return err
	})
	if err != nil {
		return idem.Record{}, false, err
	}
	return rec, found, nil
}

func (s *store) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	return s.call(ctx, "extend", key, token, true, func(ctx context.Context) error {
		err := s.w.mem.Extend(ctx, key, token, lease)
		if err == nil {
			s.w.wrote(key, token, "extend", true)
			s.w.sh(key).leaseEnd = time.Now().Add(lease)
		}
		return err
	})
}

func (s *store) Resolve(ctx context.Context, key string, response []byte, retention time.Duration) error {
	return s.call(ctx, "resolve", key, "", true, func(ctx context.Context) error {
		err := s.w.mem.Resolve(ctx, key, response, retention)
		if err == nil {
			sh := s.w.sh(key)
			sh.holder = ""
			if response == nil {
				sh.incarnation++
				sh.released = true
			}
		}
		return err
	})
}

func (s *store) StartStep(ctx context.Context, key, token, name string, retain time.Duration) (st idem.StepEntry, err error) {
	err = s.call(ctx, "start-step", key, token, true, func(ctx context.Context) error {
		var err error
		st, err = s.w.mem.StartStep(ctx, key, token, name, retain)
		if err == nil {
			s.w.wrote(key, token, "start-step", false)
			if r, ok := ctx.Value(runKey{}).(*run); ok {
				r.token = token
				s.w.tokens[token] = r
				r.stepInc[name] = s.w.sh(key).incarnation
			}
		}
		return err
	})
	if err != nil {
		return idem.StepEntry{}, err
	}
	return st, nil
}

func (s *store) FinishStep(ctx context.Context, key, token, name string, result []byte) error {
	return s.call(ctx, "finish-step", key, token, true, func(ctx context.Context) error {
		err := s.w.mem.FinishStep(ctx, key, token, name, result)
		if err == nil {
			s.w.wrote(key, token, "finish-step", false)
		}
		return err
	})
}

func (s *store) Suspend(ctx context.Context, key, token string, keep time.Duration) error {
	return s.call(ctx, "suspend", key, token, true, func(ctx context.Context) error {
		err := s.w.mem.Suspend(ctx, key, token, keep)
		if err == nil {
			s.w.wrote(key, token, "suspend", false)
			s.w.sh(key).suspended = true
			s.w.countLocked("suspend")
		}
		return err
	})
}

func (s *store) Steps(ctx context.Context, key string) (steps []idem.StepEntry, err error) {
	err = s.call(ctx, "steps", key, "", false, func(ctx context.Context) error {
		var err error
		steps, err = s.w.mem.Steps(ctx, key)
		return err
	})
	return steps, err
}

func (s *store) SetRecovery(ctx context.Context, key, token string, payload []byte, retain, lease time.Duration) error {
	return s.call(ctx, "set-recovery", key, token, true, func(ctx context.Context) error {
		err := s.w.mem.SetRecovery(ctx, key, token, payload, retain, lease)
		if err == nil {
			s.w.wrote(key, token, "set-recovery", false)
			s.w.sh(key).claimLease = lease
		}
		return err
	})
}

func (s *store) Lapsed(ctx context.Context, limit int) (due []idem.LapsedRecord, err error) {
	err = s.call(ctx, "lapsed", "", "", false, func(ctx context.Context) error {
		var err error
		due, err = s.w.mem.Lapsed(ctx, limit)
		return err
	})
	return due, err
}

func (s *store) Claim(ctx context.Context, key, token string, lease, backoff time.Duration) (c idem.RecoveryClaim, claimed bool, err error) {
	err = s.call(ctx, "claim", key, token, true, func(ctx context.Context) error {
		var err error
		c, claimed, err = s.w.mem.Claim(ctx, key, token, lease, backoff)
		if err == nil && claimed {
			if l := s.w.sh(key).claimLease; l > 0 {
				lease = l // the claim took the lease kept with the payload
			}
			s.w.acquired(key, token, lease, false, "claim")
			s.w.countLocked("claim")
		}
		return err
	})
	if err != nil {
		return idem.RecoveryClaim{}, false, err
	}
	return c, claimed, nil
}

func (s *store) ResolveStep(ctx context.Context, key, name string, result []byte) error {
	return s.call(ctx, "resolve-step", key, "", true, func(ctx context.Context) error {
		err := s.w.mem.ResolveStep(ctx, key, name, result)
		if err == nil {
			sh := s.w.sh(key)
			sh.holder = ""
			sh.suspended = false
		}
		return err
	})
}

var (
	_ idem.Store        = (*store)(nil)
	_ idem.Extender     = (*store)(nil)
	_ idem.Keeper       = (*store)(nil)
	_ idem.Journal      = (*store)(nil)
	_ idem.Recoverable  = (*store)(nil)
	_ idem.StepResolver = (*store)(nil)
)
