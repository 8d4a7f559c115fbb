package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemkit/idem/core"
)

var _ idem.Inspector = (*Store)(nil)

// inspectScript: KEYS[1] record. It returns {s, t, f, r, pttl}; missing
// fields are false (nil in the reply), so the table stays an array.
var inspectScript = redis.NewScript(`
local v = redis.call('HMGET', KEYS[1], 's', 't', 'f', 'r')
v[5] = redis.call('PTTL', KEYS[1])
return v
`)

// evictScript: KEYS[1] record; ARGV state, token ("" for none), fingerprint.
// It returns 1 when it deleted the record, 0 when the record differs.
var evictScript = redis.NewScript(`
local v = redis.call('HMGET', KEYS[1], 's', 't', 'f')
if v[1] ~= ARGV[1] or (v[2] or '') ~= ARGV[2] or v[3] ~= ARGV[3] then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
`)

// storedState maps a record state to its value in the hash's s field.
var storedState = map[idem.State]string{idem.StateInProgress: stateInProgress, idem.StateCompleted: stateCompleted}

// Inspect implements [idem.Inspector.Inspect] with one script run: the
// record and its time to live (PTTL) read atomically.
func (s *Store) Inspect(ctx context.Context, key string) (idem.RecordInfo, bool, error) {
	if err := ctx.Err(); err != nil {
		return idem.RecordInfo{}, false, err
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	v, err := inspectScript.Run(ctx, s.c, []string{s.prefix + key}).Slice()
	if err != nil {
		return idem.RecordInfo{}, false, fmt.Errorf("redisstore: inspect: %w", err)
	}
	if len(v) != 5 {
		return idem.RecordInfo{}, false, fmt.Errorf("redisstore: inspect: %w: %d fields", ErrCorrupt, len(v))
	}
	rec, found, err := parseRecord(v[:4])
	if err != nil || !found {
		return idem.RecordInfo{}, false, err
	}
	pttl, _ := v[4].(int64)
	return idem.RecordInfo{Record: rec, TTL: time.Duration(pttl) * time.Millisecond}, true, nil
}

// Evict implements [idem.Inspector.Evict] with one script run.
func (s *Store) Evict(ctx context.Context, key string, seen idem.Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	state, ok := storedState[seen.State]
	if !ok {
		return idem.ErrRecordChanged
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	deleted, err := evictScript.Run(ctx, s.c, []string{s.prefix + key}, state, seen.Token, seen.Fingerprint).Int64()
	if err != nil {
		return fmt.Errorf("redisstore: evict: %w", err)
	}
	if deleted != 1 {
		return idem.ErrRecordChanged
	}
	return nil
}
