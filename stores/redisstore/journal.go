package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemkit/idem/core"
)

var _ idem.Journal = (*Store)(nil)

// journalSuffix ends every journal key: no scoped key (hex) holds it.
const journalSuffix = ":j"

// A record's step journal ([idem.Journal]) is a Redis hash, its journal
// key, in the record's Cluster slot: prefix+key+":j" when the prefix holds
// a hash tag, else prefix+key+":j{"+prefix+key+"}". Each field is a step's
// name; its value is the step's index in the journal (two decimal digits,
// the order it was started in), '0' (started) or '1' (done), lp(token) of
// the execution that started it and, when done, the result to the end of
// the value. Only a '5' record (see record.go) owns a journal. Every
// script that writes a journal sets its expiry to the record's own
// (PEXPIRETIME, then PEXPIREAT: the same millisecond), or, once the record
// completed under a tombstone keep, to its response key's; so the journal
// never outlives its record, and goes with it: Release, Resolve with no
// response and Evict delete both.

// errJournaled reports the answer 3 of a Complete, Release or Extend
// script: the record has a journal ('5'), so the journal's script, which
// declares the journal key, must run instead. Nothing was written.
var errJournaled = errors.New("redisstore: the record has a step journal")

// luaLapse defines lapse(k, u, r): how long an in-progress value of kind k
// outlives its lease, in milliseconds (see record.go), and follow(from),
// which gives the journal key (KEYS[3]) the expiry of the key from.
const luaLapse = `
local function lapse(k, u, r)
  if k == '5' and tonumber(u) == 0 then
    return tonumber(r)
  end
  return tonumber(u)
end
local function follow(from)
  local at = redis.call('PEXPIRETIME', from)
  if at > 0 then
    redis.call('PEXPIREAT', KEYS[3], at)
  end
end
local function lp(s)
  return #s .. ':' .. s
end
`

// luaJournalOwned starts the scripts of Complete, Release and Extend on a
// record with a journal (KEYS record, response key, journal key; ARGV[1]
// the token): it returns 0 unless the record is in progress and held by
// ARGV[1], its lease live, or lapsed under Keep.Uncertain (uncertain: its
// token still owns it). It leaves the decoded fields in k, fp, u, t, r
// and the lapse in l.
const luaJournalOwned = `
local k, tok, fp, u, t, r = decode(redis.pcall('GET', KEYS[1]))
if (k ~= '1' and k ~= '3' and k ~= '5') or tok ~= ARGV[1] then
  return 0
end
local l = lapse(k, u, r)
if tonumber(u) == 0 and redis.call('PTTL', KEYS[1]) <= l then
  return 0
end
`

// luaJournalLeased starts the journal's own scripts (KEYS record,
// response key, journal key; ARGV[1] the token): it returns {0} unless
// ARGV[1] holds the record's live lease. It leaves the decoded fields in
// k, tok, fp, u, t, r, the PTTL in p and the lapse in l.
const luaJournalLeased = `
local k, tok, fp, u, t, r = decode(redis.pcall('GET', KEYS[1]))
if (k ~= '1' and k ~= '3' and k ~= '5') or tok ~= ARGV[1] then
  return {0}
end
local p = redis.call('PTTL', KEYS[1])
local l = lapse(k, u, r)
if p <= l then
  return {0}
end
`

// startScript: KEYS record, response key, journal key; ARGV token, step
// name, retain ms, MaxSteps. It returns {0} when token holds no live
// lease, {2} when the journal is full, else {1, entry}: the step's entry,
// found or added (the recovery field "#", see recovery.go, is no entry).
// Adding the first entry turns the record into a '5'
// value (TTL: what is left of the lease plus the lapse); a larger retain
// replaces r. A journal found under a record that owns none (left by an
// earlier record of the key) is deleted first.
var startScript = newScript(luaDecode + luaLapse + luaJournalLeased + `
if k ~= '5' then
  redis.call('DEL', KEYS[3])
end
local e = redis.call('HGET', KEYS[3], ARGV[2])
if e then
  return {1, e}
end
local n = redis.call('HLEN', KEYS[3]) - redis.call('HEXISTS', KEYS[3], '#')
if n >= tonumber(ARGV[4]) then
  return {2}
end
local r2 = math.max(tonumber(r), tonumber(ARGV[3]))
if k ~= '5' or r2 ~= tonumber(r) then
  local l2 = tonumber(u) > 0 and tonumber(u) or r2
  redis.call('SET', KEYS[1], '5' .. lp(tok) .. lp(fp) .. lp(u) .. lp(t) .. lp(string.format('%d', r2)), 'PX', string.format('%d', p - l + l2))
end
e = string.format('%02d', n) .. '0' .. lp(tok)
redis.call('HSET', KEYS[3], ARGV[2], e)
follow(KEYS[1])
return {1, e}
`)

// finishScript: KEYS record, response key, journal key; ARGV token, step
// name, result. It returns {0} when token holds no live lease or the step
// has no entry, else {1}, having marked the entry done with result unless
// it was done already.
var finishScript = newScript(luaDecode + luaLapse + luaJournalLeased + `
if k ~= '5' then
  return {0}
end
local e = redis.call('HGET', KEYS[3], ARGV[2])
if not e then
  return {0}
end
if string.sub(e, 3, 3) == '0' then
  redis.call('HSET', KEYS[3], ARGV[2], string.sub(e, 1, 2) .. '1' .. string.sub(e, 4) .. ARGV[3])
end
return {1}
`)

// suspendScript: KEYS record, response key, journal key[, recovery
// index]; ARGV token, keep ms[, scoped key]. It returns {0} when token
// holds no live lease, else {1}, having made the record a '5' value with u
// = keep and TTL keep: uncertain now, for keep, its journal kept as long,
// out of the recovery index (not due: see index.go).
var suspendScript = newScript(luaDecode + luaLapse + luaIndex + luaJournalLeased + `
if k ~= '5' then
  redis.call('DEL', KEYS[3])
end
redis.call('SET', KEYS[1], '5' .. lp(tok) .. lp(fp) .. lp(ARGV[2]) .. lp(t) .. lp(r), 'PX', ARGV[2])
follow(KEYS[1])
unindex()
return {1}
`)

// completeJournalScript: KEYS record, response key, journal key[,
// recovery index]; ARGV token, retention ms, encoded response[, scoped
// key]. Complete of a record with a journal: it returns 0 when token does
// not own the record, else completes it as completeScript does (see
// luaComplete) and gives the journal the retention: the record's expiry,
// or its response key's under a tombstone keep (a tombstone has no
// journal), its recovery payload dropped and its recovery index entry
// removed (see recovery.go, index.go).
var completeJournalScript = newScript(luaDecode + luaLapse + luaIndex + luaComplete + luaJournalOwned + `
local res = complete(fp, t, ARGV[2], ARGV[3])
if res == 1 and k == '5' then
  redis.call('HDEL', KEYS[3], '#')
  follow(tonumber(t) == 0 and KEYS[1] or KEYS[2])
  unindex()
end
return res
`)

// releaseJournalScript: KEYS record, response key, journal key[, recovery
// index]; ARGV token[, scoped key]. It returns 0 when token does not own
// the record, else 1, having deleted it, its journal and its recovery
// index entry.
var releaseJournalScript = newScript(luaDecode + luaLapse + luaIndex + luaJournalOwned + `
redis.call('DEL', KEYS[1], KEYS[3])
unindex()
return 1
`)

// extendJournalScript: KEYS record, response key, journal key[, recovery
// index]; ARGV token, lease ms[, scoped key]. It returns 0 when token
// does not own the record, else 1, having set the record's TTL to lease
// plus its lapse and the journal's expiry to the record's, and, for a
// record with a recovery payload (see recovery.go), its recovery index
// entry to the new lease's end plus its backoff.
var extendJournalScript = newScript(luaDecode + luaLapse + luaIndex + luaRecovery + luaJournalOwned + `
redis.call('PEXPIRE', KEYS[1], string.format('%d', tonumber(ARGV[2]) + l))
follow(KEYS[1])
if k == '5' and tonumber(u) == 0 then
  local a, b = recovery()
  if a then
    schedule(tonumber(ARGV[2]) + b)
  end
end
return 1
`)

// takeoverScript: KEYS record, response key, journal key[, recovery
// index]; ARGV token, fingerprint, lease ms, the acquirer's Keep.Uncertain
// and Keep.Tombstone in ms[, scoped key]. It is Acquire's second step when
// SET NX GET found a '5' value. It
// returns {} when the record is no '5' value any more (Acquire sends its
// SET again); {value, pttl, 1} when it took the record over: its lease had
// lapsed (no Keep.Uncertain) and its fingerprint is ARGV[2], so the record
// becomes token's, under the acquirer's keep, its journal and retain kept;
// else {value, pttl}: the record, answered (live, uncertain, or lapsed with
// another fingerprint: the key's first request left effects). A record
// taken over with a recovery payload is due at the new lease's end plus
// its backoff (never under a Keep.Uncertain: out of the index).
var takeoverScript = newScript(luaDecode + luaLapse + luaIndex + luaRecovery + `
local v = redis.pcall('GET', KEYS[1])
local k, tok, fp, u, t, r = decode(v)
if k ~= '5' then
  return {}
end
local p = redis.call('PTTL', KEYS[1])
if p > lapse(k, u, r) or tonumber(u) > 0 or fp ~= ARGV[2] then
  return {v, p}
end
local l2 = tonumber(ARGV[4]) > 0 and tonumber(ARGV[4]) or tonumber(r)
redis.call('SET', KEYS[1], '5' .. lp(ARGV[1]) .. lp(fp) .. lp(ARGV[4]) .. lp(ARGV[5]) .. lp(r), 'PX', string.format('%d', tonumber(ARGV[3]) + l2))
follow(KEYS[1])
local a, b = recovery()
if a and tonumber(ARGV[4]) == 0 then
  schedule(tonumber(ARGV[3]) + b)
elseif a then
  unindex()
end
return {v, p, 1}
`)

// stepsScript: KEYS record, response key, journal key. It returns the
// journal's fields and values (HGETALL), or {} when the record is absent,
// a tombstone, or a record that owns no journal ('1', '3').
var stepsScript = newScript(`
local v = redis.pcall('GET', KEYS[1])
if type(v) ~= 'string' then
  return {}
end
local k = string.sub(v, 1, 1)
if k == '1' or k == '3' or (k == '4' and redis.call('EXISTS', KEYS[2]) == 0) then
  return {}
end
return redis.call('HGETALL', KEYS[3])
`)

// journalKeys returns the keys of a journal script: key's record key,
// response key and journal key, all in the record's Cluster slot. It
// fails where no key can share the record's slot (see appendKeys).
func (s *Store) journalKeys(key string) ([]string, error) {
	if s.noTombstones {
		return nil, fmt.Errorf("redisstore: the prefix %q holds braces that form no Redis Cluster hash tag, so a step journal cannot share its record's slot; use a prefix without braces or with a hash tag", s.prefix)
	}
	buf, recordEnd, respEnd := s.appendKeys(make([]byte, 0, s.keysLen(key)), key)
	record := string(buf[:recordEnd])
	journal := record + journalSuffix
	if !s.tagged {
		journal += "{" + record + "}"
	}
	return []string{record, string(buf[recordEnd:respEnd]), journal}, nil
}

// eval runs sc on keys and args on the per-record path: see evalScript.
func (s *Store) eval(ctx context.Context, sc *script, keys []string, args ...any) *redis.Cmd {
	return s.evalScript(ctx, sc, keys, args...)
}

// journalCall runs one journal script for op and returns its reply's
// first element, the script's answer code, and the reply.
func (s *Store) journalCall(ctx context.Context, op string, sc *script, key string, args ...any) (int64, []any, error) {
	return s.scriptCall(ctx, op, sc, key, false, args)
}

// indexCall is journalCall for a script that keeps the recovery index
// (see index.go): given the index and the scoped key where it shares the
// record's slot.
func (s *Store) indexCall(ctx context.Context, op string, sc *script, key string, args ...any) (int64, []any, error) {
	return s.scriptCall(ctx, op, sc, key, true, args)
}

func (s *Store) scriptCall(ctx context.Context, op string, sc *script, key string, index bool, args []any) (int64, []any, error) {
	if err := ctx.Err(); err != nil {
		return 0, nil, err
	}
	keys, err := s.journalKeys(key)
	if err != nil {
		return 0, nil, err
	}
	if index {
		keys, args = s.withIndex(keys, key, args)
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	v, err := s.eval(ctx, sc, keys, args...).Slice()
	if err != nil {
		if isWrongType(err) {
			return 0, nil, fmt.Errorf("redisstore: %s: %w: the journal key holds another type than a hash (%w)", op, ErrCorrupt, err)
		}
		return 0, nil, fmt.Errorf("redisstore: %s: %w", op, err)
	}
	code, _ := v[0].(int64)
	return code, v, nil
}

// StartStep implements [idem.Journal.StartStep] with one script run. The
// first step of a record turns its value into a '5' value carrying the
// retain (see the package documentation); the entry is one hash field.
func (s *Store) StartStep(ctx context.Context, key, token, name string, retain time.Duration) (idem.StepEntry, error) {
	if retain <= 0 && ctx.Err() == nil {
		return idem.StepEntry{}, idem.ErrInvalidDuration
	}
	code, v, err := s.journalCall(ctx, "start step", startScript, key, token, name, millis(retain), idem.MaxSteps)
	switch {
	case err != nil:
		return idem.StepEntry{}, err
	case code == 0:
		return idem.StepEntry{}, idem.ErrNotOwner
	case code == 2:
		return idem.StepEntry{}, idem.ErrTooManySteps
	case len(v) != 2:
		return idem.StepEntry{}, fmt.Errorf("redisstore: start step: unexpected reply %v", v)
	}
	raw, _ := v[1].(string)
	_, e, err := parseEntry(name, raw)
	return e, err
}

// parseEntry decodes a journal entry of step name: its index and the
// entry, its Result a copy.
func parseEntry(name, raw string) (int, idem.StepEntry, error) {
	bad := fmt.Errorf("%w: step %q: a %d-byte journal entry that is not one", ErrCorrupt, name, len(raw))
	if len(raw) < 3 || (raw[2] != '0' && raw[2] != '1') {
		return 0, idem.StepEntry{}, bad
	}
	i, err := strconv.Atoi(raw[:2])
	token, rest, ok := cutLP(raw[3:])
	if err != nil || !ok || (raw[2] == '0' && rest != "") {
		return 0, idem.StepEntry{}, bad
	}
	e := idem.StepEntry{Name: name, Token: token, Done: raw[2] == '1'}
	if e.Done {
		e.Result = []byte(rest)
	}
	return i, e, nil
}

// FinishStep implements [idem.Journal.FinishStep] with one script run,
// which writes the entry's hash field again with result: about
// len(result) + len(token) + 5 bytes.
func (s *Store) FinishStep(ctx context.Context, key, token, name string, result []byte) error {
	if len(result) > idem.MaxStepBytes && ctx.Err() == nil {
		return fmt.Errorf("redisstore: finish step: %w: a %d-byte result, at most idem.MaxStepBytes", idem.ErrTooLarge, len(result))
	}
	if result == nil {
		result = []byte{}
	}
	code, _, err := s.journalCall(ctx, "finish step", finishScript, key, token, name, result)
	switch {
	case err != nil:
		return err
	case code != 1:
		return idem.ErrNotOwner
	}
	return nil
}

// Suspend implements [idem.Journal.Suspend] with one script run: the
// record becomes a '5' value whose u is keep, with TTL keep (uncertain
// from now), its journal kept as long.
func (s *Store) Suspend(ctx context.Context, key, token string, keep time.Duration) error {
	if keep <= 0 && ctx.Err() == nil {
		return idem.ErrInvalidDuration
	}
	code, _, err := s.indexCall(ctx, "suspend", suspendScript, key, token, strconv.FormatInt(millis(keep), 10))
	switch {
	case err != nil:
		return err
	case code != 1:
		return idem.ErrNotOwner
	}
	s.unindex(ctx, key)
	return nil
}

// Steps implements [idem.Journal.Steps] with one script run (HGETALL of
// the journal, checked against its record).
func (s *Store) Steps(ctx context.Context, key string) ([]idem.StepEntry, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	keys, err := s.journalKeys(key)
	if err != nil {
		return nil, err
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	v, err := s.eval(ctx, stepsScript, keys).Slice()
	if err != nil {
		if isWrongType(err) {
			return nil, fmt.Errorf("redisstore: steps: %w: the journal key holds another type than a hash (%w)", ErrCorrupt, err)
		}
		return nil, fmt.Errorf("redisstore: steps: %w", err)
	}
	if len(v) == 0 {
		return nil, nil
	}
	type indexed struct {
		i int
		e idem.StepEntry
	}
	entries := make([]indexed, 0, len(v)/2)
	for j := 0; j+1 < len(v); j += 2 {
		name, _ := v[j].(string)
		if name == recoveryField {
			continue
		}
		raw, _ := v[j+1].(string)
		i, e, err := parseEntry(name, raw)
		if err != nil {
			return nil, fmt.Errorf("redisstore: steps: %w", err)
		}
		entries = append(entries, indexed{i, e})
	}
	if len(entries) == 0 {
		return nil, nil
	}
	slices.SortFunc(entries, func(a, b indexed) int { return a.i - b.i })
	steps := make([]idem.StepEntry, len(entries))
	for j, e := range entries {
		steps[j] = e.e
	}
	return steps, nil
}

// takeover is AcquireKeep's second step when its SET found a '5' value
// (see takeoverScript). found is false when the record is no '5' value any
// more: the SET goes again. A record found in progress under token is
// taken over (acquired, the previous Token unknown: empty) while its
// lease is live: tokens are unique, so it is this takeover's own script
// run once more. Once that lease lapsed (or the record was suspended) it
// is answered as any other record.
func (s *Store) takeover(ctx context.Context, key, token, fingerprint string, lease time.Duration, keep idem.Keep) (rec idem.Record, acquired, found bool, err error) {
	keys, err := s.journalKeys(key)
	if err != nil {
		return idem.Record{}, false, false, err
	}
	keys, args := s.withIndex(keys, key, []any{token, fingerprint, millis(lease), millis(keep.Uncertain), millis(keep.Tombstone)})
	v, err := s.eval(ctx, takeoverScript, keys, args...).Slice()
	if err != nil || len(v) < 2 {
		return idem.Record{}, false, false, err
	}
	value, _ := v[0].(string)
	pttl, _ := v[1].(int64)
	st, err := parseValue(value)
	if err != nil {
		return idem.Record{}, false, false, err
	}
	// len(v) == 3: taken over. A record in progress under this token is
	// this takeover too, its script sent again (a batch resent after a
	// dropped connection): the second run finds the record token's, and
	// the previous holder's token is lost with the first run's reply.
	if len(v) == 3 {
		lapsed := time.Duration(pttl-st.lapse()) * time.Millisecond
		return idem.Record{State: idem.StateInProgress, Token: st.rec.Token, LeaseLeft: min(lapsed, -time.Millisecond)}, true, true, nil
	}
	if st.rec.State == idem.StateInProgress && st.rec.Token == token && (!st.kept || pttl > st.lapse()) { // its live lease; the previous holder is unknown
		return idem.Record{State: idem.StateInProgress, LeaseLeft: -time.Millisecond}, true, true, nil
	}
	rec, _ = st.at(pttl, "", false, 0)
	return rec, false, true, nil
}
