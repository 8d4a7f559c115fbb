package redisstore

import (
	"context"
	"fmt"
	"time"

	idem "github.com/idemkit/idem/core"
)

var _ idem.Inspector = (*Store)(nil)

// inspectScript: KEYS[1] record. It returns {value, pttl} for a string,
// {} for no key, and {type} for a key of another type (its TYPE, e.g.
// "list").
var inspectScript = newScript(`
local t = redis.call('TYPE', KEYS[1])['ok']
if t == 'string' then
  return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}
end
if t == 'none' then
  return {}
end
return {t}
`)

// evictScript: KEYS[1] record; ARGV state ("1" or "2"), token ("" for
// none), fingerprint, value. It deletes a string record whose value is
// value (in-progress: '1' lp(token) lp(fingerprint)) or starts with it
// (completed: '2' lp(fingerprint), token ""), and returns 1; otherwise 0.
var evictScript = newScript(`
local t = redis.call('TYPE', KEYS[1])['ok']
local match = false
if t == 'string' then
  local v = redis.call('GET', KEYS[1])
  if ARGV[1] == '1' then
    match = v == ARGV[4]
  else
    match = ARGV[2] == '' and string.sub(v, 1, #ARGV[4]) == ARGV[4]
  end
end
if not match then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
`)

// Inspect implements [idem.Inspector.Inspect] with one script run: the
// record and its time to live (PTTL) read atomically. A completed record's
// Response is a copy.
func (s *Store) Inspect(ctx context.Context, key string) (idem.RecordInfo, bool, error) {
	if err := ctx.Err(); err != nil {
		return idem.RecordInfo{}, false, err
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	info, found, err := s.inspect(ctx, s.prefix+key)
	if err != nil {
		return idem.RecordInfo{}, false, fmt.Errorf("redisstore: inspect: %w", err)
	}
	return info, found, nil
}

// inspect runs inspectScript on k, the full key: the record with its TTL.
// A key of another type is an error wrapping ErrCorrupt.
func (s *Store) inspect(ctx context.Context, k string) (idem.RecordInfo, bool, error) {
	v, err := s.c.EvalSha(ctx, inspectScript.sha, []string{k}).Slice()
	if isNoScript(err) {
		v, err = s.c.Eval(ctx, inspectScript.src, []string{k}).Slice()
	}
	if err != nil {
		return idem.RecordInfo{}, false, err
	}
	var rec idem.Record
	switch len(v) {
	case 0:
		return idem.RecordInfo{}, false, nil
	case 2:
		str, _ := v[0].(string)
		rec, err = parseCopy(str)
	default:
		err = fmt.Errorf("%w: a Redis %v, not a record", ErrCorrupt, v[0])
	}
	if err != nil {
		return idem.RecordInfo{}, false, err
	}
	pttl, _ := v[len(v)-1].(int64)
	return idem.RecordInfo{Record: rec, TTL: time.Duration(pttl) * time.Millisecond}, true, nil
}

// Evict implements [idem.Inspector.Evict] with one script run.
func (s *Store) Evict(ctx context.Context, key string, seen idem.Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var value []byte
	switch seen.State {
	case idem.StateInProgress:
		value = appendLP(appendOwner(nil, seen.Token), seen.Fingerprint)
	case idem.StateCompleted:
		value = appendLP([]byte{stateCompleted}, seen.Fingerprint)
	default:
		return idem.ErrRecordChanged
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	args := []any{string(value[:1]), seen.Token, seen.Fingerprint, value}
	k := []string{s.prefix + key}
	deleted, err := s.c.EvalSha(ctx, evictScript.sha, k, args...).Int64()
	if isNoScript(err) {
		deleted, err = s.c.Eval(ctx, evictScript.src, k, args...).Int64()
	}
	if err != nil {
		return fmt.Errorf("redisstore: evict: %w", err)
	}
	if deleted != 1 {
		return idem.ErrRecordChanged
	}
	return nil
}
