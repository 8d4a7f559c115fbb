package redisstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemkit/idem/core"
)

// DefaultPrefix is the key prefix used without [WithPrefix].
const DefaultPrefix = "idem:"

// DefaultWaitTimeout is the WAIT timeout used when [WithWaitReplicas] is
// given a timeout <= 0.
const DefaultWaitTimeout = 500 * time.Millisecond

// ErrNotReplicated is returned (wrapped, with the counts) by Complete under
// [WithWaitReplicas] when fewer replicas than asked acknowledged the
// completion before the WAIT timeout. The response IS stored on the primary
// and replays are served from it; only its survival of a failover is in
// doubt. It wraps [idem.ErrNotDurable]: the engine counts the record as
// completed and logs a warning.
var ErrNotReplicated = fmt.Errorf("redisstore: completion stored on the primary but not acknowledged by enough replicas: %w", idem.ErrNotDurable)

// ErrCorrupt is returned (wrapped) when a key under the prefix holds a value
// this package did not write (another type than a string, or a string that
// is not a record). It wraps [idem.ErrCorrupt]: the engine answers 500
// "stored-result-unreadable" until the key is deleted, as it does for a
// record whose response does not decode.
var ErrCorrupt = fmt.Errorf("redisstore: corrupt record: %w", idem.ErrCorrupt)

var (
	_ idem.Store    = (*Store)(nil)
	_ idem.Extender = (*Store)(nil)
	_ idem.Keeper   = (*Store)(nil)
)

// Store is an idem.Store on Redis, safe for concurrent use. It borrows its
// client and never closes it.
type Store struct {
	c redis.UniversalClient
	// b batches the commands on one record (Acquire, Complete, Release,
	// Extend, Get, Resolve, the step journal's); nil under
	// [WithoutBatching].
	b           *batcher
	prefix      string
	timeout     time.Duration
	waitN       int
	waitTimeout time.Duration
	tagged      bool // the prefix holds a Redis Cluster hash tag
	// noTombstones is set for a Cluster client whose prefix holds braces
	// that are no hash tag: no response key can share its record's slot.
	noTombstones bool
	// tombstones is set once the store acquired a record under a tombstone
	// keep: its completions declare the response key from the first run.
	tombstones atomic.Bool
}

// Option configures a Store.
type Option func(*Store)

// WithPrefix sets the prefix of every Redis key the store writes, so that
// several services (or environments) can share one Redis. Optional. Default
// is "idem:" ([DefaultPrefix]).
func WithPrefix(prefix string) Option { return func(s *Store) { s.prefix = prefix } }

// WithTimeout bounds every store method to d, on top of the caller's context
// (whichever ends first). Optional. Default is 0: the context alone bounds
// calls (the engine gives each one [idem.WithStoreTimeout], 2s by default).
//
// A command queued for a batch (see [New]) whose context ends before its
// batch is sent is dropped, never sent. A command sent waits for its reply
// as the client's Process does: go-redis applies context deadlines to the
// socket only when the client was built with ContextTimeoutEnabled: true;
// otherwise a call blocked on the network is bounded by the client's
// ReadTimeout and WriteTimeout (5s by default in go-redis v9.23), whatever
// the context says. Set ContextTimeoutEnabled, or ReadTimeout below the
// engine's store timeout.
func WithTimeout(d time.Duration) Option { return func(s *Store) { s.timeout = d } }

// WithoutBatching sends each command on one record with the client's
// Process, on a pooled connection of its own, instead of batching the
// commands of concurrent calls (see [New]). Optional. Default is batching.
func WithoutBatching() Option { return func(s *Store) { s.b = nil } }

// WithWaitReplicas makes Complete wait until n replicas acknowledged the
// completed record, with Redis WAIT n timeout, before it returns. WAIT is
// sent in one pipeline with the completion script, so a completion still
// costs one round trip, but that round trip now lasts until the replicas
// acknowledge (replication latency, up to timeout). If fewer than n
// acknowledge, Complete returns an error wrapping [ErrNotReplicated]; the
// response is stored on the primary all the same and is replayed.
//
// It narrows, not closes, the window in which a failover loses a just
// completed record (Redis replication stays asynchronous; a promoted replica
// that did acknowledge has the record). Acquire is not waited for: a lost
// in-progress record lets a retry execute while the first still runs.
// timeout is rounded up to whole milliseconds; <= 0 means
// [DefaultWaitTimeout]. Keep it below the client's ReadTimeout and the
// engine's store timeout. With a Cluster client the pipeline goes to the
// master holding the record, following MOVED and ASK redirections while
// slots migrate, so WAIT counts the replicas of the node and connection
// that wrote the completion. Optional. Default is off (n = 0).
func WithWaitReplicas(n int, timeout time.Duration) Option {
	return func(s *Store) {
		if timeout <= 0 {
			timeout = DefaultWaitTimeout
		}
		s.waitN, s.waitTimeout = n, time.Duration(millis(timeout))*time.Millisecond
	}
}

// New returns a Store using client: a *redis.Client (standalone or Sentinel
// failover) or a *redis.ClusterClient. It does no I/O and starts no
// goroutine; the client stays the caller's to configure and close.
//
// The commands on one record (those of Acquire, Complete, Release, Extend,
// Get, Resolve and the step journal) are batched: a call that finds fewer
// of the store's commands in flight than the client's pool size sends its
// command at once, with the client's Process; a call that finds the pool's
// worth in flight queues its command,
// and when a flight ends, one queued caller sends every queued command in
// one pipeline (a Cluster client splits it by node). Concurrent requests
// then share the write and read system calls of a round trip. A queued
// command whose context ends before its pipeline is sent is dropped (its
// call returns the context's error) and never sent; each call waits for
// its own reply or its own context. Every command so sent is safe to run
// twice, as go-redis does when it resends a pipeline after a dropped
// connection: see the README's "Batching". The commands that span servers
// or hold a connection (Check, Eviction, List, Inspect, Evict,
// WithWaitReplicas' script and WAIT pipeline, the recovery index) go
// through the client unbatched. [WithoutBatching] turns batching off.
func New(client redis.UniversalClient, opts ...Option) *Store {
	s := &Store{c: client, prefix: DefaultPrefix, b: &batcher{c: client, max: flushSlots(client)}}
	for _, o := range opts {
		o(s)
	}
	s.tagged = hasHashTag(s.prefix)
	_, cluster := client.(*redis.ClusterClient)
	s.noTombstones = cluster && !s.tagged && strings.ContainsAny(s.prefix, "{}")
	return s
}

// hasHashTag reports whether Redis Cluster hashes the keys under prefix by
// a hash tag in prefix: a '{' and, after the first one, a '}' with at least
// one byte between them. (Scoped keys are hex: they hold no brace.)
func hasHashTag(prefix string) bool {
	i := strings.IndexByte(prefix, '{')
	return i >= 0 && strings.IndexByte(prefix[i+1:], '}') > 0
}

// respSuffix ends every response key: no scoped key (hex) holds it.
const respSuffix = ":r"

// appendKeys appends the record key of key, prefix+key, and then its
// response key, where a record completed under [idem.Keep.Tombstone] keeps
// its response for the retention (see record.go), and returns the offsets
// where each ends. The response key is in the record's Cluster slot, as
// every key of one script must be: prefix+key+":r" when the prefix holds a
// hash tag (the same tag), else prefix+key+":r{"+prefix+key+"}", whose tag
// is the record key. It starts with the prefix, for ACL key patterns and
// SCAN. Where no key can share the record's slot (s.noTombstones), the
// response key is the record key, which luaComplete never writes a
// response to (nor AcquireKeep lets a tombstone keep come to).
func (s *Store) appendKeys(buf []byte, key string) (b []byte, recordEnd, respEnd int) {
	start := len(buf)
	buf = append(append(buf, s.prefix...), key...)
	recordEnd = len(buf)
	buf = append(buf, buf[start:recordEnd]...)
	if s.noTombstones {
		return buf, recordEnd, len(buf) // never used: see luaComplete
	}
	buf = append(buf, respSuffix...)
	if !s.tagged {
		buf = append(buf, '{')
		buf = append(buf, buf[start:recordEnd]...)
		buf = append(buf, '}')
	}
	return buf, recordEnd, len(buf)
}

// keysLen is the length of what appendKeys appends for key.
func (s *Store) keysLen(key string) int {
	n := len(s.prefix) + len(key)
	if s.tagged {
		return 2*n + len(respSuffix)
	}
	return 3*n + len(respSuffix) + 2
}

// maxBulk is Redis's default proto-max-bulk-len: the largest string argument
// a server accepts.
const maxBulk = 512 << 20

// luaDecode starts every script that reads a record: decode(v) returns
// the kind of a record value ('1' to '5', see record.go), its token (empty for
// '2' and '4'), fingerprint, u, t and r (decimal milliseconds, '0' when the
// value carries none), or nil when v is not a record (not a string: a
// missing key reads as false, a key of another type, read with
// redis.pcall, as an error table). It accepts exactly what parseValue
// accepts.
const luaDecode = `
local function field(v, i)
  local d = string.match(v, '^%d+', i)
  if not d or #d > 10 or (#d > 1 and string.byte(d) == 48) or string.byte(v, i + #d) ~= 58 then
    return nil
  end
  local j = i + #d + 1
  local e = j + tonumber(d)
  if e > #v + 1 then
    return nil
  end
  return string.sub(v, j, e - 1), e
end
local function millis(s)
  return s and #s > 0 and #s <= 15 and not string.find(s, '%D')
end
local function decode(v)
  if type(v) ~= 'string' then
    return nil
  end
  local k = string.sub(v, 1, 1)
  local tok, fp, u, t, r, i = '', nil, '0', '0', '0', 2
  if k == '1' or k == '3' or k == '5' then
    tok, i = field(v, i)
    if not tok then
      return nil
    end
  elseif k ~= '2' and k ~= '4' then
    return nil
  end
  fp, i = field(v, i)
  if not fp then
    return nil
  end
  if k == '3' or k == '5' then
    u, i = field(v, i)
    if not millis(u) then
      return nil
    end
  end
  if k ~= '1' and k ~= '2' then
    t, i = field(v, i)
    if not millis(t) then
      return nil
    end
  end
  if k == '5' then
    r, i = field(v, i)
    if not millis(r) then
      return nil
    end
  end
  if (k == '2' and i > #v) or (k ~= '2' and i ~= #v + 1) then
    return nil
  end
  return k, tok, fp, u, t, r
end
`

// luaComplete defines complete(fp, t, retention, response), shared by
// Complete and Resolve: KEYS[1] gets the completed value of fingerprint fp
// for retention ms, '2' lp(fp) response when t (the record's
// Keep.Tombstone, decimal ms) is '0'; otherwise '4' lp(fp) lp(t) for
// retention + t ms, and KEYS[2], the response key, gets response for
// retention ms, so the response is freed when the retention ends and the
// tombstone when its keep does. A response key equal to the record key
// (see appendKeys) completes without a tombstone. Under a tombstone keep
// with no KEYS[2] declared it writes nothing and returns 2: the caller runs
// the script again with the response key (see Store.complete).
const luaComplete = `
local function complete(fp, t, ret, resp)
  local f = #fp .. ':' .. fp
  if tonumber(t) ~= 0 and not KEYS[2] then
    return 2
  end
  if tonumber(t) == 0 or KEYS[2] == KEYS[1] then
    redis.call('SET', KEYS[1], '2' .. f .. resp, 'PX', ret)
  else
    redis.call('SET', KEYS[1], '4' .. f .. #t .. ':' .. t, 'PX', string.format('%d', tonumber(ret) + tonumber(t)))
    redis.call('SET', KEYS[2], resp, 'PX', ret)
  end
  return 1
end
`

// luaGet reads the value at KEYS[1] into v: a string, false for no key, or
// an error table for a key of another type (redis.pcall).
const luaGet = `
local v = redis.pcall('GET', KEYS[1])
`

// luaOwned returns 0 unless v (see luaGet) is a record in progress ('1' or
// '3', lease live or lapsed: the key lives) whose token is ARGV[1], and 3
// for a '5' value (a record with a step journal: the caller runs the
// journal's script, which declares the journal key). It leaves the decoded
// fields in fp, u and t.
const luaOwned = `
local k, tok, fp, u, t = decode(v)
if k == '5' then
  return 3
end
if (k ~= '1' and k ~= '3') or tok ~= ARGV[1] then
  return 0
end
`

// luaCompleteOwn is completeScript's path for the value of every
// completion under the zero Keep: v (see luaGet) is a '1' value whose
// token is ARGV[1] when it starts with '1' lp(ARGV[1]), and what follows
// is then the fingerprint as the completed value holds it, lp(fp), which
// it checks as decode does (digits without a leading zero, at most 10,
// ':' and exactly that many bytes to the end). Such a value completes
// with one SET, with no decoding of the record and no helper functions
// defined (the Lua run is part of Redis's time for every fresh request);
// any other value goes on to decode, which decides as before.
const luaCompleteOwn = `
if type(v) == 'string' then
  local p = '1' .. #ARGV[1] .. ':' .. ARGV[1]
  if string.sub(v, 1, #p) == p then
    local f = string.sub(v, #p + 1)
    local d = string.match(f, '^%d+')
    if d and #d <= 10 and (#d == 1 or string.byte(d) ~= 48) and #f == #d + 1 + tonumber(d) and string.byte(f, #d + 1) == 58 then
      redis.call('SET', KEYS[1], '2' .. f .. ARGV[3], 'PX', ARGV[2])
      return 1
    end
  end
end
`

// completeScript: KEYS record[, response key]; ARGV token, retention ms,
// encoded response. It returns 1 when completed (see luaComplete), 2 when
// it needs the response key, 0 when token holds no in-progress record.
var completeScript = newScript(luaGet + luaCompleteOwn + luaDecode + luaComplete + luaOwned + `
return complete(fp, t, ARGV[2], ARGV[3])
`)

// releaseScript: KEYS record; ARGV token. It returns 1 when deleted.
var releaseScript = newScript(luaGet + luaDecode + luaOwned + `
redis.call('DEL', KEYS[1])
return 1
`)

// extendScript: KEYS record; ARGV token, lease ms. It returns 1 when
// renewed: the key's TTL is the lease plus the record's Keep.Uncertain.
var extendScript = newScript(luaGet + luaDecode + luaOwned + `
redis.call('PEXPIRE', KEYS[1], string.format('%d', tonumber(ARGV[2]) + tonumber(u)))
return 1
`)

// resolveScript: KEYS record[, response key, journal key[, recovery
// index]]; ARGV retention ms (empty to release), encoded response[,
// scoped key]. It returns 0 unless the record is uncertain ('3' or '5'
// with u > 0 and PTTL <= u); otherwise it deletes it and its journal
// (release) or completes it, its journal kept for the retention (see
// luaComplete), removes its recovery index entry (see index.go), and
// returns 1; 2 asks for the other keys.
var resolveScript = newScript(luaDecode + luaLapse + luaIndex + luaComplete + `
local k, tok, fp, u, t = decode(redis.pcall('GET', KEYS[1]))
if (k ~= '3' and k ~= '5') or tonumber(u) == 0 or redis.call('PTTL', KEYS[1]) > tonumber(u) then
  return 0
end
if k == '5' and not KEYS[3] then
  return 2
end
if ARGV[1] == '' then
  for i = 1, math.min(#KEYS, 3) do
    redis.call('DEL', KEYS[i])
  end
  unindex()
  return 1
end
local res = complete(fp, t, ARGV[1], ARGV[2])
if res == 1 and k == '5' then
  follow(tonumber(t) == 0 and KEYS[1] or KEYS[2])
  unindex()
end
return res
`)

// peekScript: KEYS record[, response key]. It returns {} for no key,
// {type} for a key of another type (its TYPE, e.g. "list"), {value, pttl}
// for a string, and {value, pttl, response, response pttl} for a '4' value
// whose response key was given and lives: a record and what decides its
// state, read atomically.
var peekScript = newScript(`
local ty = redis.call('TYPE', KEYS[1])['ok']
if ty == 'none' then
  return {}
end
if ty ~= 'string' then
  return {ty}
end
local v = redis.call('GET', KEYS[1])
local p = redis.call('PTTL', KEYS[1])
if string.sub(v, 1, 1) == '4' and KEYS[2] then
  local r = redis.pcall('GET', KEYS[2])
  if type(r) == 'string' then
    return {v, p, r, redis.call('PTTL', KEYS[2])}
  end
end
return {v, p}
`)

// millis rounds d up to whole milliseconds, the TTL unit of Redis.
func millis(d time.Duration) int64 {
	ms := int64(d / time.Millisecond)
	if d%time.Millisecond != 0 {
		ms++
	}
	return ms
}

func (s *Store) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.timeout > 0 {
		return context.WithTimeout(ctx, s.timeout)
	}
	return ctx, func() {}
}

// Acquire implements [idem.Store.Acquire]: it is AcquireKeep with the
// zero Keep.
func (s *Store) Acquire(ctx context.Context, key, token, fingerprint string, lease time.Duration) (idem.Record, bool, error) {
	return s.AcquireKeep(ctx, key, token, fingerprint, lease, idem.Keep{})
}

// maxPeeks bounds how often AcquireKeep sends its SET again when the kept
// record it found is gone before it could read its state.
const maxPeeks = 3

// AcquireKeep implements [idem.Keeper.AcquireKeep] with one command, no
// script: SET key value PX lease+keep.Uncertain NX GET. It sets the
// in-progress value ('1' for the zero Keep, '3' carrying keep otherwise)
// when the key is absent (or expired: a lapsed lease, an ended keep) and
// otherwise returns the live value, unchanged. A live value equal to the
// one it would write (same token, fingerprint and keep) is this caller's
// own SET, sent again by the client after a lost reply: it counts as
// acquired, and the lease runs from that first SET. A completed record's
// Response is a view of the reply, which nothing else holds.
//
// A record found in progress gets its [idem.Record.LeaseLeft] from one
// more command (PTTL). A kept record found ('3' or '4') costs one more
// round trip too, a script reading the record, its TTL and its response
// key atomically, which tells in progress from uncertain, and completed
// (with its response) from expired; when that record is gone by then, the
// SET is sent again. On a Cluster client whose prefix holds braces that
// form no hash tag, a keep with a Tombstone is refused with an error (its
// response key could not share the record's slot).
func (s *Store) AcquireKeep(ctx context.Context, key, token, fingerprint string, lease time.Duration, keep idem.Keep) (idem.Record, bool, error) {
	if err := ctx.Err(); err != nil {
		return idem.Record{}, false, err
	}
	if lease <= 0 || keep.Uncertain < 0 || keep.Tombstone < 0 {
		return idem.Record{}, false, idem.ErrInvalidDuration
	}
	if keep.Tombstone > 0 && s.noTombstones {
		return idem.Record{}, false, fmt.Errorf("redisstore: acquire: the prefix %q holds braces that form no Redis Cluster hash tag, so a tombstone's response key cannot share its record's slot; use a prefix without braces or with a hash tag", s.prefix)
	}
	if keep.Tombstone > 0 && !s.tombstones.Load() {
		s.tombstones.Store(true)
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	set := newAcquire(s.prefix, key, token, fingerprint, millis(lease), millis(keep.Uncertain), millis(keep.Tombstone))
	for peeks := 1; ; peeks++ {
		old, exists, err := s.setNXGet(ctx, set)
		switch {
		case err != nil:
			return idem.Record{}, false, fmt.Errorf("redisstore: acquire: %w", err)
		case !exists || old == set.value: // written, or our own SET sent again
			return idem.Record{}, true, nil
		}
		st, err := parseValue(old)
		if err != nil {
			return idem.Record{}, false, fmt.Errorf("redisstore: acquire: %w", err)
		}
		if !st.kept {
			if st.rec.State == idem.StateInProgress {
				st.rec.LeaseLeft = s.leaseLeft(ctx, set.key)
			}
			return st.rec, false, nil
		}
		var rec idem.Record
		var found bool
		if st.journal {
			var acquired bool
			rec, acquired, found, err = s.takeover(ctx, key, token, fingerprint, lease, keep)
			if acquired {
				return rec, true, nil
			}
		} else {
			rec, _, found, err = s.peek(ctx, key, st.rec.State == idem.StateCompleted)
		}
		switch {
		case err != nil:
			return idem.Record{}, false, fmt.Errorf("redisstore: acquire: %w", err)
		case found:
			return rec, false, nil
		case peeks == maxPeeks: // gone each time: answer what the SET found
			if st.rec.State == idem.StateCompleted {
				st.rec.State = idem.StateExpired // its response unread
			}
			return st.rec, false, nil
		}
	}
}

// leaseLeft returns the PTTL of an in-progress record found by Acquire
// ([idem.Record.LeaseLeft]), 0 when it cannot tell: the key changed or
// vanished since the SET, or PTTL failed (the answer is a hint; Acquire's
// decision stands). It costs a round trip on this path only, so that
// Acquire's SET (the path of every fresh request) stays one command.
func (s *Store) leaseLeft(ctx context.Context, key string) time.Duration {
	left, err := s.pttl(ctx, key)
	if err != nil || left <= 0 { // -1ns: no TTL, -2ns: no key
		return 0
	}
	return left
}

// peek reads the record of key with peekScript, declaring its response
// key when withResp (for a '4' value: without it, a '4' value reads as
// expired): the record as it stands (a completed record's Response is a
// view of the reply), its time to live, and found = false when the key is
// absent. Only the scripts that may need the response key declare it: a
// script declaring a key that does not exist is answered TRYAGAIN while
// its slot migrates. A key of another type or
// a value that is not a record is an error wrapping ErrCorrupt.
func (s *Store) peek(ctx context.Context, key string, withResp bool) (rec idem.Record, ttl time.Duration, found bool, err error) {
	buf, recordEnd, respEnd := s.appendKeys(make([]byte, 0, s.keysLen(key)), key)
	all := view(buf)
	keys := []string{all[:recordEnd], all[recordEnd:respEnd]}
	if !withResp {
		keys = keys[:1]
	}
	v, err := s.evalScript(ctx, peekScript, keys).Slice()
	if err != nil {
		return idem.Record{}, 0, false, err
	}
	switch len(v) {
	case 0:
		return idem.Record{}, 0, false, nil
	case 1:
		return idem.Record{}, 0, false, fmt.Errorf("%w: a Redis %v, not a record", ErrCorrupt, v[0])
	}
	value, _ := v[0].(string)
	pttl, _ := v[1].(int64)
	st, err := parseValue(value)
	if err != nil {
		return idem.Record{}, 0, false, err
	}
	var resp string
	var respTTL int64
	if len(v) == 4 {
		resp, _ = v[2].(string)
		respTTL, _ = v[3].(int64)
	}
	rec, ttl = st.at(pttl, resp, len(v) == 4, respTTL)
	return rec, ttl, true, nil
}

// setNXGet sends Acquire's SET and returns the value the key held (exists)
// or reports that the SET wrote the key (!exists). err wraps ErrCorrupt
// when the key holds another type (WRONGTYPE).
//
// The SET goes as a raw command, whose reply go-redis does not parse:
// parsed, the nil reply of a SET that wrote the key is an error (redis.Nil)
// that go-redis runs through its retry classification, some 17
// allocations and a fifth of the client's CPU time for a fresh request.
// go-redis acts on error replies (MOVED and ASK redirections, READONLY
// and LOADING retries) only for parsed commands, so an error reply other
// than WRONGTYPE sends the SET again, parsed. That is safe: an error reply
// means the SET did not run, and had it run, its value under the same token
// reads as acquired.
func (s *Store) setNXGet(ctx context.Context, set *setCmd) (old string, exists bool, err error) {
	raw := set.rawCommand(ctx)
	if err := s.send(ctx, raw); err != nil {
		return "", false, err
	}
	b, err := raw.Result()
	if err != nil {
		return "", false, err
	}
	if old, exists, ok := parseBulkReply(b); ok {
		return old, exists, nil
	}
	if bytes.HasPrefix(b, []byte("-WRONGTYPE")) {
		return "", false, fmt.Errorf("%w: the key holds another type than a string (%s)", ErrCorrupt, bytes.TrimSpace(b[1:]))
	}
	cmd := set.command(ctx)
	if err := s.send(ctx, cmd); err != nil {
		return "", false, err
	}
	old, err = cmd.Result()
	switch {
	case err == nil:
		return old, true, nil
	case errors.Is(err, redis.Nil):
		return "", false, nil
	case isWrongType(err):
		return "", false, fmt.Errorf("%w: the key holds another type than a string (%w)", ErrCorrupt, err)
	}
	return "", false, err
}

// Complete implements [idem.Store.Complete] with one script run; under
// [WithWaitReplicas] the script and WAIT share one pipeline. A response
// above 512 MiB (Redis's default proto-max-bulk-len) is refused with an
// error wrapping [idem.ErrTooLarge] before any I/O.
func (s *Store) Complete(ctx context.Context, key, token string, response []byte, retention time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if retention <= 0 {
		return idem.ErrInvalidDuration
	}
	if len(response) > maxBulk {
		return fmt.Errorf("redisstore: complete: %w: a %d-byte response, Redis accepts at most 512 MiB", idem.ErrTooLarge, len(response))
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	withResp := s.tombstones.Load()
	err := s.complete(ctx, key, token, response, retention, withResp)
	if !withResp && errors.Is(err, errNeedsRespKey) {
		err = s.complete(ctx, key, token, response, retention, true)
	}
	if errors.Is(err, errJournaled) {
		err = s.completeJournal(ctx, key, token, response, retention)
	}
	return err
}

// errNeedsRespKey reports the completion script's answer 2: the record
// was acquired under a tombstone keep, so its script run must declare the
// response key too. Nothing was written.
var errNeedsRespKey = errors.New("redisstore: the completion needs the response key")

// complete runs completeScript once: on the record key alone, or, when
// withResp, on the record key and its response key. A store that never
// acquired under a tombstone keep completes on the record key alone (one
// key, as every other command: no TRYAGAIN while its slot migrates); a
// record acquired under a tombstone keep (by another Store value) answers
// errNeedsRespKey to that, and Complete runs the script again with both.
// A store that did acquire under a tombstone keep declares both keys from
// the first run.
func (s *Store) complete(ctx context.Context, key, token string, response []byte, retention time.Duration, withResp bool) error {
	var buf []byte
	var keyEnds [2]int
	if withResp {
		buf = make([]byte, 0, s.keysLen(key)+len(token)+20+len(response))
		buf, keyEnds[0], keyEnds[1] = s.appendKeys(buf, key)
	} else {
		buf = make([]byte, 0, len(s.prefix)+len(key)+len(token)+20+len(response))
		buf = append(append(buf, s.prefix...), key...)
		keyEnds[0] = len(buf)
	}
	buf = append(buf, token...)
	tokenEnd := len(buf)
	buf = strconv.AppendInt(buf, millis(retention), 10)
	ttlEnd := len(buf)
	buf = append(buf, response...)
	ev := newEval(completeScript, 1, buf, keyEnds[0], tokenEnd, ttlEnd, len(buf))
	if withResp {
		ev = newEval(completeScript, 2, buf, keyEnds[0], keyEnds[1], tokenEnd, ttlEnd, len(buf))
	}
	if s.waitN > 0 {
		return s.completeAndWait(ctx, ev.strs[0], func(ctx context.Context, source bool) *redis.IntCmd {
			return ev.command(ctx, completeScript, source)
		})
	}
	ok, err := s.run(ctx, completeScript, ev)
	switch {
	case err != nil:
		return fmt.Errorf("redisstore: complete: %w", err)
	case ok == 2:
		return errNeedsRespKey
	case ok == 3:
		return errJournaled
	case ok != 1:
		return idem.ErrNotOwner
	}
	return nil
}

// completeJournal completes a record with a step journal with
// completeJournalScript, on its three keys; under [WithWaitReplicas] the
// script and WAIT share one pipeline.
func (s *Store) completeJournal(ctx context.Context, key, token string, response []byte, retention time.Duration) error {
	keys, err := s.journalKeys(key)
	if err != nil {
		return fmt.Errorf("redisstore: complete: %w", err)
	}
	keys, argv := s.withIndex(keys, key, []any{token, millis(retention), response})
	run := func(ctx context.Context, source bool) *redis.IntCmd {
		args := make([]any, 0, 3+len(keys)+len(argv))
		args = append(args, "evalsha", completeJournalScript.shaArg, len(keys))
		for _, k := range keys {
			args = append(args, k)
		}
		args = append(args, argv...)
		if source {
			args[0], args[1] = "eval", completeJournalScript.srcArg
		}
		cmd := redis.NewIntCmd(ctx, args...)
		cmd.SetFirstKeyPos(3)
		return cmd
	}
	if s.waitN > 0 {
		err := s.completeAndWait(ctx, keys[0], run)
		if err == nil || errors.Is(err, ErrNotReplicated) {
			s.unindex(ctx, key)
		}
		return err
	}
	cmd := run(ctx, false)
	if err := s.send(ctx, cmd); err != nil {
		return fmt.Errorf("redisstore: complete: %w", err)
	}
	if isNoScript(cmd.Err()) {
		cmd = run(ctx, true)
		if err := s.send(ctx, cmd); err != nil {
			return fmt.Errorf("redisstore: complete: %w", err)
		}
	}
	ok, err := cmd.Result()
	switch {
	case err != nil:
		return fmt.Errorf("redisstore: complete: %w", err)
	case ok != 1:
		return idem.ErrNotOwner
	}
	s.unindex(ctx, key)
	return nil
}

// run runs ev on the client with EVALSHA, and once more with EVAL when the
// server's script cache lacks the script (restart, failover, SCRIPT FLUSH).
func (s *Store) run(ctx context.Context, sc *script, ev *evalCmd) (int64, error) {
	cmd := ev.command(ctx, sc, false)
	if err := s.send(ctx, cmd); err != nil {
		return 0, err
	}
	if isNoScript(cmd.Err()) {
		cmd = ev.command(ctx, sc, true)
		if err := s.send(ctx, cmd); err != nil {
			return 0, err
		}
	}
	return cmd.Result()
}

// ownerJournal runs sc, releaseJournalScript or extendJournalScript, on
// the three keys of a record with a journal (and the recovery index, see
// index.go), with token and args.
func (s *Store) ownerJournal(ctx context.Context, sc *script, key, token string, args ...any) (int64, error) {
	keys, err := s.journalKeys(key)
	if err != nil {
		return 0, err
	}
	keys, args = s.withIndex(keys, key, append([]any{token}, args...))
	return s.eval(ctx, sc, keys, args...).Int64()
}

// isNoScript reports a NOSCRIPT reply to EVALSHA.
func isNoScript(err error) bool { return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") }

// completeAndWait runs a completion script, the command run returns
// (EVALSHA, or EVAL when source is set), and WAIT in one pipeline, on
// the master owning k, the record key, when the client is a Cluster client. WAIT counts the
// replicas that acknowledged the writes of the connection it is sent on, so
// both commands must share one connection: a pipeline to one node.
func (s *Store) completeAndWait(ctx context.Context, k string, run func(ctx context.Context, source bool) *redis.IntCmd) error {
	var c redis.Cmdable = s.c
	cluster, isCluster := s.c.(*redis.ClusterClient)
	if isCluster {
		node, err := cluster.MasterForKey(ctx, k)
		if err != nil {
			return fmt.Errorf("redisstore: complete: %w", err)
		}
		c = node
	}
	res, acked, err := s.pipeCompleteWait(ctx, c, run, false)
	// The slot moved (MOVED) or is moving and the record is already on the
	// importing master (ASK): send the pipeline again to the master the
	// error names, after ASKING for ASK. Rare (resharding).
	for redirects := 0; isCluster && redirects < 3; redirects++ {
		addr, moved := redis.IsMovedError(err)
		askAddr, ask := redis.IsAskError(err)
		if !moved && !ask {
			break
		}
		if ask {
			addr = askAddr
		}
		node, ferr := masterAt(ctx, cluster, addr)
		if ferr != nil {
			return fmt.Errorf("redisstore: complete: %w (after %w)", ferr, err)
		}
		res, acked, err = s.pipeCompleteWait(ctx, node, run, ask)
	}
	if err != nil {
		return fmt.Errorf("redisstore: complete: %w", err)
	}
	if res == 2 {
		return errNeedsRespKey
	}
	if res == 3 {
		return errJournaled
	}
	if res != 1 {
		return idem.ErrNotOwner
	}
	if acked < int64(s.waitN) {
		return fmt.Errorf("%w: %d of %d replicas acknowledged within %v", ErrNotReplicated, acked, s.waitN, s.waitTimeout)
	}
	return nil
}

// masterAt returns the cluster client's connection pool for the master at
// addr (host:port), reloading the cluster's state if it is stale.
func masterAt(ctx context.Context, cluster *redis.ClusterClient, addr string) (*redis.Client, error) {
	var mu sync.Mutex
	var found *redis.Client
	err := cluster.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		if c.Options().Addr == addr {
			mu.Lock()
			found = c
			mu.Unlock()
		}
		return nil
	})
	if err == nil && found == nil {
		err = fmt.Errorf("no master at %s", addr)
	}
	return found, err
}

// pipeCompleteWait sends [ASKING,] the completion script's EVALSHA and WAIT in one
// pipeline on c, and once more with EVAL when the server's script cache
// lacks the script (restart, failover, SCRIPT FLUSH, a node that never ran
// it).
func (s *Store) pipeCompleteWait(ctx context.Context, c redis.Cmdable, mk func(ctx context.Context, source bool) *redis.IntCmd, ask bool) (res, acked int64, err error) {
	res, acked, err = s.pipeOnce(ctx, c, mk, ask, false)
	if isNoScript(err) {
		res, acked, err = s.pipeOnce(ctx, c, mk, ask, true)
	}
	return res, acked, err
}

func (s *Store) pipeOnce(ctx context.Context, c redis.Cmdable, mk func(ctx context.Context, source bool) *redis.IntCmd, ask, source bool) (res, acked int64, err error) {
	pipe := c.Pipeline()
	if ask {
		pipe.Do(ctx, "asking")
	}
	run := mk(ctx, source)
	_ = pipe.Process(ctx, run)
	wait := pipe.Do(ctx, "wait", s.waitN, s.waitTimeout.Milliseconds())
	_, _ = pipe.Exec(ctx)
	if res, err = run.Result(); err != nil {
		return 0, 0, err
	}
	if acked, err = wait.Int64(); err != nil {
		return res, 0, err
	}
	return res, acked, nil
}

// Release implements [idem.Store.Release] with one script run.
func (s *Store) Release(ctx context.Context, key, token string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	buf := make([]byte, 0, len(s.prefix)+len(key)+len(token))
	buf = append(append(append(buf, s.prefix...), key...), token...)
	keyEnd := len(s.prefix) + len(key)
	ok, err := s.run(ctx, releaseScript, newEval(releaseScript, 1, buf, keyEnd, len(buf)))
	if err == nil && ok == 3 { // a record with a journal
		if ok, err = s.ownerJournal(ctx, releaseJournalScript, key, token); err == nil && ok == 1 {
			s.unindex(ctx, key)
		}
	}
	if err != nil {
		return fmt.Errorf("redisstore: release: %w", err)
	}
	if ok != 1 {
		return idem.ErrNotOwner
	}
	return nil
}

// Extend implements [idem.Extender] with one script run.
func (s *Store) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if lease <= 0 {
		return idem.ErrInvalidDuration
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	buf := make([]byte, 0, len(s.prefix)+len(key)+len(token)+20)
	buf = append(append(append(buf, s.prefix...), key...), token...)
	keyEnd, tokenEnd := len(s.prefix)+len(key), len(buf)
	buf = strconv.AppendInt(buf, millis(lease), 10)
	ok, err := s.run(ctx, extendScript, newEval(extendScript, 1, buf, keyEnd, tokenEnd, len(buf)))
	if err == nil && ok == 3 { // a record with a journal
		ok, err = s.ownerJournal(ctx, extendJournalScript, key, token, millis(lease))
	}
	if err != nil {
		return fmt.Errorf("redisstore: extend: %w", err)
	}
	if ok != 1 {
		return idem.ErrNotOwner
	}
	return nil
}

// Get implements [idem.Store.Get] with one GET, and, for a kept record
// ('3', '4'), the script AcquireKeep reads its state with. With a Cluster
// client configured to read from replicas (ReadOnly, RouteByLatency,
// RouteRandomly) it may return a slightly stale record. A completed
// record's Response is a copy.
func (s *Store) Get(ctx context.Context, key string) (idem.Record, bool, error) {
	if err := ctx.Err(); err != nil {
		return idem.Record{}, false, err
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	v, err := s.get(ctx, s.prefix+key)
	switch {
	case errors.Is(err, redis.Nil):
		return idem.Record{}, false, nil
	case isWrongType(err):
		return idem.Record{}, false, fmt.Errorf("redisstore: get: %w: the key holds another type than a string (%w)", ErrCorrupt, err)
	case err != nil:
		return idem.Record{}, false, fmt.Errorf("redisstore: get: %w", err)
	}
	st, err := parseValue(v)
	if err != nil {
		return idem.Record{}, false, fmt.Errorf("redisstore: get: %w", err)
	}
	rec, found := st.rec, true
	if st.kept {
		if rec, _, found, err = s.peek(ctx, key, st.rec.State == idem.StateCompleted); err != nil {
			return idem.Record{}, false, fmt.Errorf("redisstore: get: %w", err)
		}
	}
	rec.LeaseLeft = 0
	rec.Response = bytes.Clone(rec.Response)
	return rec, found, nil
}

// Resolve implements [idem.Keeper.Resolve] with one script run: it
// deletes (response nil) or completes an uncertain record, a '3' value
// whose PTTL is at most its Keep.Uncertain, and returns
// [idem.ErrRecordChanged] for anything else. A completion keeps the
// record's Keep.Tombstone, as Complete does.
func (s *Store) Resolve(ctx context.Context, key string, response []byte, retention time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if response != nil && retention <= 0 {
		return idem.ErrInvalidDuration
	}
	if len(response) > maxBulk {
		return fmt.Errorf("redisstore: resolve: %w: a %d-byte response, Redis accepts at most 512 MiB", idem.ErrTooLarge, len(response))
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	for _, withResp := range []bool{false, true} {
		if withResp && !s.noTombstones {
			return s.resolveJournal(ctx, key, response, retention)
		}
		buf := make([]byte, 0, s.keysLen(key)+20+len(response))
		buf, recordEnd, respEnd := s.appendKeys(buf, key)
		if !withResp {
			buf, respEnd = buf[:recordEnd], recordEnd
		}
		if response != nil {
			buf = strconv.AppendInt(buf, millis(retention), 10)
		}
		ttlEnd := len(buf)
		buf = append(buf, response...)
		ev := newEval(resolveScript, 1, buf, recordEnd, ttlEnd, len(buf))
		if withResp {
			ev = newEval(resolveScript, 2, buf, recordEnd, respEnd, ttlEnd, len(buf))
		}
		ok, err := s.run(ctx, resolveScript, ev)
		switch {
		case err != nil:
			return fmt.Errorf("redisstore: resolve: %w", err)
		case ok == 1:
			return nil
		case ok != 2: // 2: it needs the response key (see luaComplete)
			return idem.ErrRecordChanged
		}
	}
	return idem.ErrRecordChanged
}

// resolveJournal runs resolveScript on the record's three keys: its
// second run, for a record whose completion needs its response key or
// that has a journal.
func (s *Store) resolveJournal(ctx context.Context, key string, response []byte, retention time.Duration) error {
	keys, err := s.journalKeys(key)
	if err != nil {
		return fmt.Errorf("redisstore: resolve: %w", err)
	}
	ret := ""
	if response != nil {
		ret = strconv.FormatInt(millis(retention), 10)
	}
	keys, args := s.withIndex(keys, key, []any{ret, response})
	ok, err := s.eval(ctx, resolveScript, keys, args...).Int64()
	switch {
	case err != nil:
		return fmt.Errorf("redisstore: resolve: %w", err)
	case ok != 1:
		return idem.ErrRecordChanged
	}
	s.unindex(ctx, key)
	return nil
}

// isWrongType reports Redis's WRONGTYPE reply: the key holds another type
// than the command works on.
func isWrongType(err error) bool { return err != nil && redis.HasErrorPrefix(err, "WRONGTYPE") }
