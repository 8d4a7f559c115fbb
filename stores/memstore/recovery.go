package memstore

import (
	"context"
	"slices"
	"time"

	idem "github.com/idemkit/idem/core"
)

// SetRecovery implements [idem.Recoverable.SetRecovery].
func (s *Store) SetRecovery(ctx context.Context, key, token string, payload []byte, retain, lease time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if retain <= 0 || lease <= 0 {
		return idem.ErrInvalidDuration
	}
	if len(payload) == 0 || len(payload) > idem.MaxRecoveryBytes {
		return idem.ErrTooLarge
	}
	stored := slices.Clone(payload)
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.leased(key, token, s.now())
	if e == nil {
		return idem.ErrNotOwner
	}
	e.payload, e.rlease = stored, lease
	if sh.recov == nil {
		sh.recov = make(map[string]struct{})
	}
	sh.recov[key] = struct{}{}
	e.retain = max(e.retain, retain)
	e.expires = e.until.Add(e.lapse())
	return nil
}

// due reports whether e is due for recovery at now: in progress, not
// kept uncertain, with a payload, its lease lapsed at least its backoff
// ago.
func (e *entry) due(now time.Time) bool {
	return e.state == idem.StateInProgress && e.keep.Uncertain == 0 && e.payload != nil &&
		now.Before(e.expires) && !now.Before(e.until.Add(e.backoff))
}

// Lapsed implements [idem.Recoverable.Lapsed]: a scan of every shard's
// records with a recovery payload (in flight or due: completed records
// leave that set), soonest due first (memstore's records die with its
// process, so only a store wrapped to hide [idem.LocalStore] in tests ever
// has lapsed ones).
func (s *Store) Lapsed(ctx context.Context, limit int) ([]idem.LapsedRecord, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	type dueRecord struct {
		rec idem.LapsedRecord
		at  time.Time
	}
	var found []dueRecord
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		now := s.now()
		for k := range sh.recov {
			e := sh.m[k]
			if e == nil || e.payload == nil || !now.Before(e.expires) {
				delete(sh.recov, k) // completed, gone, or replaced: never due again under this payload
				continue
			}
			if e.due(now) {
				found = append(found, dueRecord{idem.LapsedRecord{Key: k, Attempts: e.attempts}, e.until.Add(e.backoff)})
			}
		}
		sh.mu.Unlock()
	}
	slices.SortFunc(found, func(a, b dueRecord) int { return a.at.Compare(b.at) })
	out := make([]idem.LapsedRecord, 0, min(limit, len(found)))
	for _, d := range found[:min(max(limit, 0), len(found))] {
		out = append(out, d.rec)
	}
	return out, nil
}

// Claim implements [idem.Recoverable.Claim].
func (s *Store) Claim(ctx context.Context, key, token string, lease, backoff time.Duration) (idem.RecoveryClaim, bool, error) {
	if err := ctx.Err(); err != nil {
		return idem.RecoveryClaim{}, false, err
	}
	if lease <= 0 || backoff < 0 {
		return idem.RecoveryClaim{}, false, idem.ErrInvalidDuration
	}
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.now()
	e := sh.live(key, now)
	if e == nil || !e.due(now) {
		return idem.RecoveryClaim{}, false, nil
	}
	c := idem.RecoveryClaim{Payload: slices.Clone(e.payload), Fingerprint: e.fp, Attempts: e.attempts + 1,
		PreviousToken: e.token, Lapsed: max(now.Sub(e.until), 1)}
	e.token, e.attempts, e.backoff = token, c.Attempts, backoff
	if e.rlease > 0 {
		lease = e.rlease
	}
	e.until = now.Add(lease)
	e.expires = e.until.Add(e.lapse())
	return c, true, nil
}

// ResolveStep implements [idem.StepResolver.ResolveStep]. The record
// becomes in progress with its lease lapsed now, kept for its retain from
// now, its recovery attempts counted from zero again (an operator settled
// what stopped it).
func (s *Store) ResolveStep(ctx context.Context, key, name string, result []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(result) > idem.MaxStepBytes {
		return idem.ErrTooLarge
	}
	var stored []byte
	if result != nil {
		stored = append([]byte{}, result...) // a copy, never nil
	}
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.now()
	e := sh.live(key, now)
	if e == nil || e.state != idem.StateInProgress || now.Before(e.until) {
		return idem.ErrRecordChanged // absent, completed or expired, or its lease live
	}
	i := slices.IndexFunc(e.steps, func(st idem.StepEntry) bool { return st.Name == name })
	if i < 0 || e.steps[i].Done {
		return idem.ErrRecordChanged
	}
	steps := slices.Clone(e.steps)
	if stored == nil {
		steps = slices.Delete(steps, i, i+1)
	} else {
		steps[i].Done, steps[i].Result = true, stored
	}
	e.steps = steps
	e.keep.Uncertain = 0
	e.until = now
	e.attempts, e.backoff = 0, 0
	e.expires = now.Add(max(e.retain, time.Nanosecond))
	return nil
}
