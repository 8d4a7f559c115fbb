package redisstore

import (
	"bytes"
	"context"
	"fmt"
	"strconv"

	idem "github.com/idemkit/idem/core"
)

var _ idem.Inspector = (*Store)(nil)

// evictScript: KEYS record[, response key, journal key: given unless the
// prefix forbids them (see appendKeys)[, recovery index]]; ARGV state (the
// decimal idem.State seen: 1 in progress, 2 completed, 3 uncertain, 4
// expired), token (empty for none), fingerprint[, scoped key]. It deletes
// the record, its response key, its journal and its recovery index entry
// (see index.go) when the record still has that state, token and
// fingerprint, and returns 1; otherwise 0. A '3' or '5' value is in
// progress while its PTTL is above its lapse, else uncertain (a '5' value
// with no u: in progress, lapsed); a '4' value is completed while its
// response key lives, else expired.
var evictScript = newScript(luaDecode + luaLapse + luaIndex + `
local k, tok, fp, u, t, r = decode(redis.pcall('GET', KEYS[1]))
if not k or tok ~= ARGV[2] or fp ~= ARGV[3] then
  return 0
end
local st = k
if k == '3' or k == '5' then
  st = (redis.call('PTTL', KEYS[1]) > lapse(k, u, r) or tonumber(u) == 0) and '1' or '3'
elseif k == '4' then
  if not KEYS[2] then
    return 0
  end
  st = redis.call('EXISTS', KEYS[2]) == 1 and '2' or '4'
end
if st ~= ARGV[1] then
  return 0
end
for i = 1, math.min(#KEYS, 3) do
  redis.call('DEL', KEYS[i])
end
unindex()
return 1
`)

// Inspect implements [idem.Inspector.Inspect] with one script run: the
// record, its time to live (PTTL) and, for a record completed under a
// tombstone keep, its response key read atomically. A completed record's
// Response is a copy.
func (s *Store) Inspect(ctx context.Context, key string) (idem.RecordInfo, bool, error) {
	if err := ctx.Err(); err != nil {
		return idem.RecordInfo{}, false, err
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	rec, ttl, found, err := s.peek(ctx, key, false)
	if err == nil && rec.State == idem.StateExpired { // a '4' value: read its response key too
		rec, ttl, found, err = s.peek(ctx, key, true)
	}
	if err != nil {
		return idem.RecordInfo{}, false, fmt.Errorf("redisstore: inspect: %w", err)
	}
	rec.LeaseLeft = 0
	rec.Response = bytes.Clone(rec.Response)
	return idem.RecordInfo{Record: rec, TTL: ttl}, found, nil
}

// Evict implements [idem.Inspector.Evict] with one script run, which
// deletes the record, its response key and its journal.
func (s *Store) Evict(ctx context.Context, key string, seen idem.Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	switch seen.State {
	case idem.StateInProgress, idem.StateCompleted, idem.StateUncertain, idem.StateExpired:
	default:
		return idem.ErrRecordChanged
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	args := []any{strconv.Itoa(int(seen.State)), seen.Token, seen.Fingerprint}
	keys, err := s.journalKeys(key)
	if err != nil { // no key can share the record's slot: the record has none
		keys = []string{s.prefix + key}
	} else {
		keys, args = s.withIndex(keys, key, args)
	}
	deleted, err := s.c.EvalSha(ctx, evictScript.sha, keys, args...).Int64()
	if isNoScript(err) {
		deleted, err = s.c.Eval(ctx, evictScript.src, keys, args...).Int64()
	}
	if err != nil {
		return fmt.Errorf("redisstore: evict: %w", err)
	}
	if deleted != 1 {
		return idem.ErrRecordChanged
	}
	s.unindex(ctx, key)
	return nil
}
