package redisstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
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
)

// Store is an idem.Store on Redis, safe for concurrent use. It borrows its
// client and never closes it.
type Store struct {
	c           redis.UniversalClient
	prefix      string
	timeout     time.Duration
	waitN       int
	waitTimeout time.Duration
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
// go-redis applies context deadlines to the socket only when the client was
// built with ContextTimeoutEnabled: true; otherwise a call blocked on the
// network is bounded by the client's ReadTimeout and WriteTimeout (5s by
// default in go-redis v9.23), whatever the context says. Set
// ContextTimeoutEnabled, or ReadTimeout below the engine's store timeout.
func WithTimeout(d time.Duration) Option { return func(s *Store) { s.timeout = d } }

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
// failover) or a *redis.ClusterClient. It does no I/O; the client stays the
// caller's to configure and close.
func New(client redis.UniversalClient, opts ...Option) *Store {
	s := &Store{c: client, prefix: DefaultPrefix}
	for _, o := range opts {
		o(s)
	}
	return s
}

// maxBulk is Redis's default proto-max-bulk-len: the largest string argument
// a server accepts.
const maxBulk = 512 << 20

// ownerCheck starts the scripts of Complete, Release and Extend (KEYS[1]
// record, ARGV[1] owner: '1' lp(token)): it returns 0 unless the value is
// an in-progress value of that owner, '1' lp(token) lp(fingerprint), and
// leaves lp(fingerprint) in f. It reads with redis.pcall, so a key of
// another type (a foreign value) answers 0, not WRONGTYPE. A missing key
// reads as false.
const ownerCheck = `
local v = redis.pcall('GET', KEYS[1])
local o = ARGV[1]
if type(v) ~= 'string' or string.sub(v, 1, #o) ~= o then
  return 0
end
local f = string.sub(v, #o + 1)
local d = string.match(f, '^(%d+):')
if not d or (#d > 1 and string.sub(d, 1, 1) == '0') or #f ~= #d + 1 + tonumber(d) then
  return 0
end
`

// completeScript: ARGV owner, retention ms, encoded response. It returns 1
// when completed ('2' lp(fingerprint) response, PX retention), 0 when token
// holds no live lease.
var completeScript = newScript(ownerCheck + `
redis.call('SET', KEYS[1], '2' .. f .. ARGV[3], 'PX', ARGV[2])
return 1
`)

// releaseScript: ARGV owner. It returns 1 when deleted.
var releaseScript = newScript(ownerCheck + `
redis.call('DEL', KEYS[1])
return 1
`)

// extendScript: ARGV owner, lease ms. It returns 1 when renewed.
var extendScript = newScript(ownerCheck + `
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
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

// Acquire implements [idem.Store.Acquire] with one command, no script:
// SET key value PX lease NX GET. It sets the in-progress value when the key
// is absent (or expired: a lapsed lease) and otherwise returns the live
// value, unchanged. A live value equal to the one it would write (same
// token, same fingerprint) is this caller's own SET, sent again by the
// client after a lost reply: it counts as acquired, and the lease runs from
// that first SET. A completed record's Response is a view of the reply,
// which nothing else holds. A record found in progress gets its
// [idem.Record.LeaseLeft] from one more command (PTTL).
func (s *Store) Acquire(ctx context.Context, key, token, fingerprint string, lease time.Duration) (idem.Record, bool, error) {
	if err := ctx.Err(); err != nil {
		return idem.Record{}, false, err
	}
	if lease <= 0 {
		return idem.Record{}, false, idem.ErrInvalidDuration
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	set := newAcquire(s.prefix, key, token, fingerprint, millis(lease))
	old, exists, err := s.setNXGet(ctx, set)
	switch {
	case err != nil:
		return idem.Record{}, false, fmt.Errorf("redisstore: acquire: %w", err)
	case !exists || old == set.value: // written, or our own SET sent again
		return idem.Record{}, true, nil
	}
	rec, err := parseValue(old)
	if err != nil {
		return idem.Record{}, false, fmt.Errorf("redisstore: acquire: %w", err)
	}
	if rec.State == idem.StateInProgress {
		rec.LeaseLeft = s.leaseLeft(ctx, set.key)
	}
	return rec, false, nil
}

// leaseLeft returns the PTTL of an in-progress record found by Acquire
// ([idem.Record.LeaseLeft]), 0 when it cannot tell: the key changed or
// vanished since the SET, or PTTL failed (the answer is a hint; Acquire's
// decision stands). It costs a round trip on this path only, so that
// Acquire's SET (the path of every fresh request) stays one command.
func (s *Store) leaseLeft(ctx context.Context, key string) time.Duration {
	left, err := s.c.PTTL(ctx, key).Result()
	if err != nil || left <= 0 { // -1ns: no TTL, -2ns: no key
		return 0
	}
	return left
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
	raw := redis.NewRawCmd(ctx, set.args[:]...)
	raw.SetFirstKeyPos(1)
	_ = s.c.Process(ctx, raw)
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
	_ = s.c.Process(ctx, cmd)
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
	buf, keyEnd, ownerEnd := keyAndOwner(s.prefix, key, token, 20+len(response))
	buf = strconv.AppendInt(buf, millis(retention), 10)
	ttlEnd := len(buf)
	buf = append(buf, response...)
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	ev := newEval(completeScript, buf, keyEnd, ownerEnd, ttlEnd, len(buf))
	if s.waitN > 0 {
		return s.completeAndWait(ctx, ev)
	}
	ok, err := s.run(ctx, completeScript, ev)
	if err != nil {
		return fmt.Errorf("redisstore: complete: %w", err)
	}
	if ok != 1 {
		return idem.ErrNotOwner
	}
	return nil
}

// run runs ev on the client with EVALSHA, and once more with EVAL when the
// server's script cache lacks the script (restart, failover, SCRIPT FLUSH).
func (s *Store) run(ctx context.Context, sc *script, ev *evalCmd) (int64, error) {
	cmd := ev.command(ctx, sc, false)
	_ = s.c.Process(ctx, cmd)
	if isNoScript(cmd.Err()) {
		cmd = ev.command(ctx, sc, true)
		_ = s.c.Process(ctx, cmd)
	}
	return cmd.Result()
}

// isNoScript reports a NOSCRIPT reply to EVALSHA.
func isNoScript(err error) bool { return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") }

// completeAndWait runs the completion script and WAIT in one pipeline, on
// the master owning k when the client is a Cluster client. WAIT counts the
// replicas that acknowledged the writes of the connection it is sent on, so
// both commands must share one connection: a pipeline to one node.
func (s *Store) completeAndWait(ctx context.Context, ev *evalCmd) error {
	k := ev.strs[0]
	var c redis.Cmdable = s.c
	cluster, isCluster := s.c.(*redis.ClusterClient)
	if isCluster {
		node, err := cluster.MasterForKey(ctx, k)
		if err != nil {
			return fmt.Errorf("redisstore: complete: %w", err)
		}
		c = node
	}
	res, acked, err := s.pipeCompleteWait(ctx, c, ev, false)
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
		res, acked, err = s.pipeCompleteWait(ctx, node, ev, ask)
	}
	if err != nil {
		return fmt.Errorf("redisstore: complete: %w", err)
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

// pipeCompleteWait sends [ASKING,] EVALSHA completeScript and WAIT in one
// pipeline on c, and once more with EVAL when the server's script cache
// lacks the script (restart, failover, SCRIPT FLUSH, a node that never ran
// it).
func (s *Store) pipeCompleteWait(ctx context.Context, c redis.Cmdable, ev *evalCmd, ask bool) (res, acked int64, err error) {
	res, acked, err = s.pipeOnce(ctx, c, ev, ask, false)
	if isNoScript(err) {
		res, acked, err = s.pipeOnce(ctx, c, ev, ask, true)
	}
	return res, acked, err
}

func (s *Store) pipeOnce(ctx context.Context, c redis.Cmdable, ev *evalCmd, ask, source bool) (res, acked int64, err error) {
	pipe := c.Pipeline()
	if ask {
		pipe.Do(ctx, "asking")
	}
	run := ev.command(ctx, completeScript, source)
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
	buf, keyEnd, ownerEnd := keyAndOwner(s.prefix, key, token, 0)
	ok, err := s.run(ctx, releaseScript, newEval(releaseScript, buf, keyEnd, ownerEnd))
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
	buf, keyEnd, ownerEnd := keyAndOwner(s.prefix, key, token, 20)
	buf = strconv.AppendInt(buf, millis(lease), 10)
	ok, err := s.run(ctx, extendScript, newEval(extendScript, buf, keyEnd, ownerEnd, len(buf)))
	if err != nil {
		return fmt.Errorf("redisstore: extend: %w", err)
	}
	if ok != 1 {
		return idem.ErrNotOwner
	}
	return nil
}

// Get implements [idem.Store.Get] with one GET. With a Cluster client
// configured to read from replicas (ReadOnly, RouteByLatency,
// RouteRandomly) it may return a slightly stale record.
func (s *Store) Get(ctx context.Context, key string) (idem.Record, bool, error) {
	if err := ctx.Err(); err != nil {
		return idem.Record{}, false, err
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	v, err := s.c.Get(ctx, s.prefix+key).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return idem.Record{}, false, nil
	case isWrongType(err):
		return idem.Record{}, false, fmt.Errorf("redisstore: get: %w: the key holds another type than a string (%w)", ErrCorrupt, err)
	case err != nil:
		return idem.Record{}, false, fmt.Errorf("redisstore: get: %w", err)
	}
	rec, err := parseCopy(v)
	if err != nil {
		return idem.Record{}, false, fmt.Errorf("redisstore: get: %w", err)
	}
	return rec, true, nil
}

// isWrongType reports Redis's WRONGTYPE reply: the key holds another type
// than the command works on.
func isWrongType(err error) bool { return err != nil && redis.HasErrorPrefix(err, "WRONGTYPE") }
