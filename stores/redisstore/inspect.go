package redisstore

import (
	"bytes"
	"context"
	"fmt"
	"strconv"

	idem "github.com/idemkit/idem/core"
)

var _ idem.Inspector = (*Store)(nil)

// evictScript: KEYS record[, response key: given for a record seen
// completed or expired]; ARGV state (the decimal
// idem.State seen: 1 in progress, 2 completed, 3 uncertain, 4 expired),
// token (empty for none), fingerprint. It deletes the record and its response
// key when the record still has that state, token and fingerprint, and
// returns 1; otherwise 0. A '3' value is in progress while its PTTL is
// above u (always when u is 0), else uncertain; a '4' value is completed while its response key
// lives, else expired.
var evictScript = newScript(luaDecode + `
local k, tok, fp, u = decode(redis.pcall('GET', KEYS[1]))
if not k or tok ~= ARGV[2] or fp ~= ARGV[3] then
  return 0
end
local st = k
if k == '3' then
  st = (tonumber(u) == 0 or redis.call('PTTL', KEYS[1]) > tonumber(u)) and '1' or '3'
elseif k == '4' then
  if not KEYS[2] then
    return 0
  end
  st = redis.call('EXISTS', KEYS[2]) == 1 and '2' or '4'
end
if st ~= ARGV[1] then
  return 0
end
redis.call('DEL', unpack(KEYS))
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
// deletes the record and its response key.
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
	buf, recordEnd, respEnd := s.appendKeys(make([]byte, 0, s.keysLen(key)), key)
	all := view(buf)
	keys := []string{all[:recordEnd], all[recordEnd:respEnd]}
	if seen.State == idem.StateInProgress || seen.State == idem.StateUncertain {
		keys = keys[:1] // no response key: see peek
	}
	args := []any{strconv.Itoa(int(seen.State)), seen.Token, seen.Fingerprint}
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
	return nil
}
