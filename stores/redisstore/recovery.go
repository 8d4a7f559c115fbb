package redisstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemkit/idem/core"
)

var (
	_ idem.Recoverable  = (*Store)(nil)
	_ idem.StepResolver = (*Store)(nil)
)

// A record's recovery state ([idem.Recoverable]) is the field "#" of its
// journal hash (see journal.go; no step name holds '#'): 'L' lp(lease ms)
// lp(attempts) lp(backoff ms) payload, the lease being the one a Claim takes
// (a state without the 'L' and its lease, lp(attempts) lp(backoff ms)
// payload, was written by an earlier version: a Claim of it takes the
// lease it is given). It lives and dies with the journal, so with its
// '5' record: kept past the lease for the retain, taken over by a client's
// Acquire with the record's fingerprint, deleted by Release, Evict and
// Resolve, dropped (HDEL) by Complete.
//
// The records due for recovery are found through one sorted set per store,
// its recovery index at prefix+"recovery" (no scoped key, hex, is that),
// member the scoped key, score the time in microseconds (the server's
// clock) at which the record is due: every transition keeps it in the same
// script (see index.go). Lapsed looks at the entries whose time came,
// answers those due, moves the others to the time they will be due (at
// most [RecoveryRecheck] later), and removes those that no longer can be
// (expired, or, on Redis Cluster without a hash tag, an entry a lost
// command left), with a script of its own on the index that changes an
// entry only if its score is still the one seen.

// recoveryField is the journal hash's field holding the recovery state.
const recoveryField = "#"

// recoveryIndex is the suffix of the prefix naming the recovery index.
const recoveryIndex = "recovery"

// RecoveryRecheck is the longest Lapsed puts off looking at a record
// with a recovery payload again: a record whose lease is live is looked
// at when it will be due, or RecoveryRecheck later if sooner, so that a
// lease shortened since (an Extend with a shorter lease) is noticed
// within RecoveryRecheck of its lapse.
const RecoveryRecheck = 5 * time.Second

// luaRecovery defines recovery(), which reads the journal's recovery
// field into attempts, backoff (numbers), payload and lease (a number, nil
// in a state written without one), or returns nil, and
// setRecovery(a, b, pl, l), which writes it (without a lease when l is
// nil).
const luaRecovery = `
local function recovery()
  local v = redis.call('HGET', KEYS[3], '#')
  if not v then
    return nil
  end
  local l, i = nil, 1
  if string.byte(v, 1) == 76 then
    l, i = field(v, 2)
  end
  local a, j = field(v, i)
  local b, m = field(v, j)
  return tonumber(a), tonumber(b), string.sub(v, m), tonumber(l)
end
local function setRecovery(a, b, pl, l)
  local v = lp(tostring(a)) .. lp(tostring(b)) .. pl
  if l then
    v = 'L' .. lp(tostring(l)) .. v
  end
  redis.call('HSET', KEYS[3], '#', v)
end
local function now()
  local tm = redis.call('TIME')
  return tonumber(tm[1]) * 1000000 + tonumber(tm[2])
end
`

// setRecoveryScript: KEYS record, response key, journal key[, recovery
// index]; ARGV token, payload, retain ms, lease ms[, scoped key]. It
// returns {0} when token holds no live lease, else {1}, having stored the
// payload and the lease (attempts and backoff kept), made the record a '5' value whose retain is
// the larger of its own and ARGV[3], as startScript does, and placed it in
// the recovery index at its lease's end plus its backoff (out of it under
// a Keep.Uncertain: it turns uncertain, never due). Twice: the same
// payload, retain and due time written again.
var setRecoveryScript = newScript(luaDecode + luaLapse + luaIndex + luaRecovery + luaJournalLeased + `
if k ~= '5' then
  redis.call('DEL', KEYS[3])
end
local r2 = math.max(tonumber(r), tonumber(ARGV[3]))
if k ~= '5' or r2 ~= tonumber(r) then
  local l2 = tonumber(u) > 0 and tonumber(u) or r2
  redis.call('SET', KEYS[1], '5' .. lp(tok) .. lp(fp) .. lp(u) .. lp(t) .. lp(string.format('%d', r2)), 'PX', string.format('%d', p - l + l2))
end
local a, b = recovery()
setRecovery(a or 0, b or 0, ARGV[2], ARGV[4])
follow(KEYS[1])
if tonumber(u) == 0 then
  schedule(p - l + (b or 0))
else
  unindex()
end
return {1}
`)

// luaDue sets, for the record at KEYS[1] with its journal at KEYS[3]: k,
// tok, fp, u, t, r (decoded), p (PTTL), the recovery state a, b, pl, and
// lease (nil without), lapsed, how long its lease lapsed (ms, <= 0 while live). It returns {0}
// when the record cannot be due ever again: no '5' value, a Keep.Uncertain
// (it turns uncertain), no payload, no expiry.
const luaDue = `
local k, tok, fp, u, t, r = decode(redis.pcall('GET', KEYS[1]))
if k ~= '5' or tonumber(u) ~= 0 then
  return {0}
end
local a, b, pl, lease = recovery()
local p = redis.call('PTTL', KEYS[1])
if not a or p < 0 then
  return {0}
end
local lapsed = tonumber(r) - p
`

// dueScript: KEYS record, response key, journal key; ARGV the longest
// wait in µs. It returns {0} when the record cannot be due again (see
// luaDue), {1, attempts} when it is due, {2, at} when it will be due at
// at (µs, the server's clock), or ARGV[1] from now if sooner. A read: safe
// twice.
var dueScript = newScript(luaDecode + luaRecovery + luaDue + `
if lapsed > 0 and lapsed >= b then
  return {1, a}
end
return {2, now() + math.min((b - lapsed) * 1000, tonumber(ARGV[1]))}
`)

// claimScript: KEYS record, response key, journal key[, recovery index];
// ARGV token, lease ms, backoff ms[, scoped key]. It returns {0} when the
// record is not due, else takes it over for ARGV[1], for the lease kept
// in its recovery state (ARGV[2] for a state without), as takeoverScript does
// (journal, payload and retain kept, Keep.Tombstone kept), counts an
// attempt, stores the backoff, moves its recovery index entry to the
// claim's lease's end plus the backoff, and returns {1, payload,
// fingerprint, attempts, previous token, lapsed ms}. Twice with the same
// token (a resent pipeline): the second finds the lease live, not due, and
// changes nothing, so one attempt is counted and the payload kept.
var claimScript = newScript(luaDecode + luaLapse + luaIndex + luaRecovery + luaDue + `
if lapsed <= 0 or lapsed < b then
  return {0}
end
local ls = lease or tonumber(ARGV[2])
redis.call('SET', KEYS[1], '5' .. lp(ARGV[1]) .. lp(fp) .. lp('0') .. lp(t) .. lp(r), 'PX', string.format('%d', ls + tonumber(r)))
follow(KEYS[1])
setRecovery(a + 1, ARGV[3], pl, lease)
schedule(ls + tonumber(ARGV[3]))
return {1, pl, fp, a + 1, tok, lapsed}
`)

// resolveStepScript: KEYS record, response key, journal key[, recovery
// index]; ARGV step name, '1' (done with ARGV[3]) or '0' (not done)[,
// scoped key]. It returns {0} unless
// the record is a '5' value, uncertain (lapsed under its u) or lapsed
// within its retain, whose journal holds the step, not done; else it
// marks the step done or removes it (moving each later entry's index down
// by one: the indexes stay 0 to n-1 in start order, as startScript gives
// a new entry the index n), rewrites the record with u = 0 (in
// progress, lapsed: its TTL unchanged, or its retain when it was
// uncertain; at most its retain less a millisecond, so that its lease has
// lapsed by one and a Claim right after finds it due), counts its
// recovery attempts from 0 again with backoff 0 (its payload kept, its
// recovery index entry due now), and returns {1, 1 when it has a recovery
// payload}. Twice: the step is then done or absent: {0}.
var resolveStepScript = newScript(luaDecode + luaLapse + luaIndex + luaRecovery + `
local k, tok, fp, u, t, r = decode(redis.pcall('GET', KEYS[1]))
if k ~= '5' then
  return {0}
end
local p = redis.call('PTTL', KEYS[1])
local uncertain = tonumber(u) > 0 and p <= tonumber(u)
if p < 0 or not (uncertain or (tonumber(u) == 0 and p <= tonumber(r))) then
  return {0}
end
local e = redis.call('HGET', KEYS[3], ARGV[1])
if not e or string.sub(e, 3, 3) ~= '0' then
  return {0}
end
if ARGV[2] == '1' then
  redis.call('HSET', KEYS[3], ARGV[1], string.sub(e, 1, 2) .. '1' .. string.sub(e, 4) .. ARGV[3])
else
  redis.call('HDEL', KEYS[3], ARGV[1])
  local at = tonumber(string.sub(e, 1, 2))
  for _, f in ipairs(redis.call('HKEYS', KEYS[3])) do
    if string.sub(f, 1, 1) ~= '#' then
      local v = redis.call('HGET', KEYS[3], f)
      local i = tonumber(string.sub(v, 1, 2))
      if i > at then
        redis.call('HSET', KEYS[3], f, string.format('%02d', i - 1) .. string.sub(v, 3))
      end
    end
  end
end
local px = math.min(uncertain and tonumber(r) or p, tonumber(r) - 1)
redis.call('SET', KEYS[1], '5' .. lp(tok) .. lp(fp) .. lp('0') .. lp(t) .. lp(r), 'PX', string.format('%d', math.max(px, 1)))
follow(KEYS[1])
local a, b, pl, l = recovery()
if not a then
  return {1, 0}
end
setRecovery(0, 0, pl, l)
schedule(0)
return {1, 1}
`)

// indexScript: KEYS the recovery index; ARGV triples of member, the
// score seen, and the new score ('-' to remove). Each entry changes only
// if its score is still the one seen: an entry a SetRecovery added since
// is kept. Twice: the second finds the scores changed, and changes nothing.
var indexScript = newScript(`
for i = 1, #ARGV, 3 do
  local sc = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if sc and tonumber(sc) == tonumber(ARGV[i + 1]) then
    if ARGV[i + 2] == '-' then
      redis.call('ZREM', KEYS[1], ARGV[i])
    else
      redis.call('ZADD', KEYS[1], 'XX', ARGV[i + 2], ARGV[i])
    end
  end
end
return 0
`)

// indexKey is the store's recovery index.
func (s *Store) indexKey() string { return s.prefix + recoveryIndex }

// nowMicros is the instance's clock in µs, the score of a fresh entry.
func nowMicros() int64 { return time.Now().UnixMicro() }

// SetRecovery implements [idem.Recoverable.SetRecovery] with one script
// run, which places the record in the recovery index (see index.go). On
// Redis Cluster with a prefix without a hash tag, the script and a ZADD of
// the key to the index (the instance's clock: due now, moved by Lapsed to
// the lease's end) share one pipeline, one command per node; a lost ZADD
// is reported as an error, and an entry without a payload (the script
// refused) is removed by Lapsed.
func (s *Store) SetRecovery(ctx context.Context, key, token string, payload []byte, retain, lease time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	switch {
	case retain <= 0 || lease <= 0:
		return idem.ErrInvalidDuration
	case len(payload) > idem.MaxRecoveryBytes:
		return fmt.Errorf("redisstore: set recovery: %w: a %d-byte payload, at most idem.MaxRecoveryBytes", idem.ErrTooLarge, len(payload))
	case len(payload) == 0:
		return errors.New("redisstore: set recovery: empty payload")
	}
	keys, err := s.journalKeys(key)
	if err != nil {
		return err
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	keys, args := s.withIndex(keys, key, []any{token, payload, millis(retain), millis(lease)})
	var cmd *redis.Cmd
	if s.indexed() {
		cmd = s.eval(ctx, setRecoveryScript, keys, args...)
	} else {
		var run, add redis.Cmder
		_, _ = s.c.Pipelined(ctx, func(p redis.Pipeliner) error {
			run = p.EvalSha(ctx, setRecoveryScript.sha, keys, args...)
			add = p.ZAdd(ctx, s.indexKey(), redis.Z{Score: float64(nowMicros()), Member: key})
			return nil
		})
		cmd, _ = run.(*redis.Cmd)
		if isNoScript(cmd.Err()) {
			cmd = s.c.Eval(ctx, setRecoveryScript.src, keys, args...)
		}
		if err := add.Err(); err != nil {
			return fmt.Errorf("redisstore: set recovery: index: %w", err)
		}
	}
	v, err := cmd.Slice()
	if err != nil {
		if isWrongType(err) {
			return fmt.Errorf("redisstore: set recovery: %w: the journal key holds another type than a hash (%w)", ErrCorrupt, err)
		}
		return fmt.Errorf("redisstore: set recovery: %w", err)
	}
	if code, _ := v[0].(int64); code != 1 {
		return idem.ErrNotOwner
	}
	return nil
}

// lapsedBudget bounds how long one Lapsed call looks past index entries
// that are not due (at most half of what its context leaves): it starts
// no round that would end past it (by the last round's time), and then
// answers the due records it found; a later round's failure too.
const lapsedBudget = time.Second

// Lapsed implements [idem.Recoverable.Lapsed]: rounds of a script reading
// up to limit entries of the recovery index whose time came (ZRANGE
// BYSCORE -inf now, the server's clock), one pipeline of a read-only
// script per entry's record (due now, due later, or never), and one script
// on the index that moves the entries due later to their time and removes
// the others: 3 round trips a round, each bounded by limit. Since every
// transition keeps the index (see index.go), the first round's entries
// are the due records; a round that met entries not due goes on past
// them, until limit records are due, every entry whose time came was
// seen, or [lapsedBudget] passed. It returns the records due now,
// soonest due first.
func (s *Store) Lapsed(ctx context.Context, limit int) ([]idem.LapsedRecord, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if limit <= 0 {
		return nil, errors.New("redisstore: lapsed: limit must be > 0")
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	budget := lapsedBudget
	if d, ok := ctx.Deadline(); ok {
		budget = min(budget, time.Until(d)/2)
	}
	end := time.Now().Add(budget)
	var due []idem.LapsedRecord
	for round := 0; ; round++ {
		start := time.Now()
		n, more, err := s.lapsedRound(ctx, len(due), limit-len(due), &due)
		switch {
		case err != nil && round == 0:
			return nil, err
		case err != nil: // a later round: what the first ones found stands
			return due, nil
		case !more || n == 0 || len(due) >= limit || time.Now().Add(time.Since(start)).After(end):
			return due, nil // seen every entry whose time came, or no time for another round
		}
	}
}

// lapsedRound reads up to count index entries whose time came, after the
// offset entries due already found (they stay, at the front), appends
// those due to due, and moves or removes the others. It returns how many
// entries it moved or removed, and more: the read was full (more entries
// may have come).
func (s *Store) lapsedRound(ctx context.Context, offset, count int, due *[]idem.LapsedRecord) (fixed int, more bool, err error) {
	raw, err := s.eval(ctx, rangeScript, []string{s.indexKey()}, offset, count).Slice()
	if err != nil && !errors.Is(err, redis.Nil) {
		return 0, false, fmt.Errorf("redisstore: lapsed: %w", err)
	}
	type entry struct{ member, score string }
	entries := make([]entry, 0, len(raw)/2)
	for i := 0; i+1 < len(raw); i += 2 {
		m, _ := raw[i].(string)
		sc, _ := raw[i+1].(string)
		entries = append(entries, entry{m, sc})
	}
	if len(entries) == 0 {
		return 0, false, nil
	}
	keys := make([][]string, len(entries))
	cmds := make([]*redis.Cmd, len(entries))
	_, err = s.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, e := range entries {
			if keys[i], err = s.journalKeys(e.member); err != nil {
				return err
			}
			cmds[i] = p.EvalSha(ctx, dueScript.sha, keys[i], RecoveryRecheck.Microseconds())
		}
		return nil
	})
	if err != nil && !isNoScript(err) && !isWrongType(err) {
		return 0, false, fmt.Errorf("redisstore: lapsed: %w", err)
	}
	var fix []any
	for i, e := range entries {
		cmd := cmds[i]
		if isNoScript(cmd.Err()) {
			cmd = s.eval(ctx, dueScript, keys[i], RecoveryRecheck.Microseconds())
		}
		v, err := cmd.Slice()
		switch {
		case isWrongType(err):
			v = []any{int64(0)} // a journal key of another type: never due
		case err != nil:
			return 0, false, fmt.Errorf("redisstore: lapsed: %w", err)
		}
		code, _ := v[0].(int64)
		switch code {
		case 1:
			n, _ := v[1].(int64)
			*due = append(*due, idem.LapsedRecord{Key: e.member, Attempts: int(n)})
		case 2:
			at, _ := v[1].(int64)
			fix = append(fix, e.member, e.score, at)
		default:
			fix = append(fix, e.member, e.score, "-")
		}
	}
	if len(fix) > 0 {
		if err := s.eval(ctx, indexScript, []string{s.indexKey()}, fix...).Err(); err != nil && !errors.Is(err, redis.Nil) {
			return 0, false, fmt.Errorf("redisstore: lapsed: index: %w", err)
		}
	}
	return len(fix) / 3, len(entries) == count, nil
}

// Claim implements [idem.Recoverable.Claim] with one script run on the
// record, its journal and its recovery index entry (see index.go), which
// takes the lease kept in the record's recovery state.
func (s *Store) Claim(ctx context.Context, key, token string, lease, backoff time.Duration) (idem.RecoveryClaim, bool, error) {
	if err := ctx.Err(); err != nil {
		return idem.RecoveryClaim{}, false, err
	}
	if lease <= 0 || backoff < 0 {
		return idem.RecoveryClaim{}, false, idem.ErrInvalidDuration
	}
	code, v, err := s.indexCall(ctx, "claim", claimScript, key, token, millis(lease), millis(backoff))
	switch {
	case err != nil:
		return idem.RecoveryClaim{}, false, err
	case code != 1:
		return idem.RecoveryClaim{}, false, nil
	case len(v) != 6:
		return idem.RecoveryClaim{}, false, fmt.Errorf("redisstore: claim: unexpected reply %v", v)
	}
	payload, _ := v[1].(string)
	fp, _ := v[2].(string)
	attempts, _ := v[3].(int64)
	prev, _ := v[4].(string)
	lapsed, _ := v[5].(int64)
	return idem.RecoveryClaim{
		Payload: []byte(payload), Fingerprint: fp, Attempts: int(attempts),
		PreviousToken: prev, Lapsed: time.Duration(lapsed) * time.Millisecond,
	}, true, nil
}

// ResolveStep implements [idem.StepResolver.ResolveStep] with one script
// run (which also counts the record's recovery attempts from zero again,
// backoff 0, and makes a record with a recovery payload due now in the
// recovery index); on Redis Cluster with a prefix without a hash tag, a
// ZADD of its key to the index follows.
func (s *Store) ResolveStep(ctx context.Context, key, name string, result []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(result) > idem.MaxStepBytes {
		return fmt.Errorf("redisstore: resolve step: %w: a %d-byte result, at most idem.MaxStepBytes", idem.ErrTooLarge, len(result))
	}
	mode := "0"
	if result != nil {
		mode = "1"
	}
	code, v, err := s.indexCall(ctx, "resolve step", resolveStepScript, key, name, mode, result)
	switch {
	case err != nil:
		return err
	case code != 1:
		return idem.ErrRecordChanged
	}
	if has, _ := v[1].(int64); has == 1 && !s.indexed() {
		ctx, cancel := s.ctx(ctx)
		defer cancel()
		if err := s.c.ZAdd(ctx, s.indexKey(), redis.Z{Score: float64(nowMicros()), Member: key}).Err(); err != nil {
			return fmt.Errorf("redisstore: resolve step: the step is resolved, its index entry lost: %w", err)
		}
	}
	return nil
}
