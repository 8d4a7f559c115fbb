package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
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
// this package did not write (another type, a hash of other fields) or a
// response that does not decode. It wraps [idem.ErrCorrupt]: the engine
// answers 500 "stored-result-unreadable" until the key is deleted.
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

// Record hash fields and state values; the scripts spell them out literally.
const (
	stateInProgress = "1"
	stateCompleted  = "2"
)

// acquireScript: KEYS[1] record; ARGV token, fingerprint, lease ms.
// It returns {} when it acquired, else the live record {s, t, f, r}.
// A record in progress under the same token is this caller's own acquire
// replayed by a client retry after a lost reply: it counts as acquired.
var acquireScript = redis.NewScript(`
local v = redis.call('HMGET', KEYS[1], 's', 't', 'f', 'r')
if v[1] and not (v[1] == '1' and v[2] == ARGV[1]) then
  return v
end
redis.call('HSET', KEYS[1], 's', '1', 't', ARGV[1], 'f', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {}
`)

// completeScript: KEYS[1] record; ARGV token, encoded response, retention ms.
// It returns 1 when completed, 0 when token holds no live lease.
var completeScript = redis.NewScript(`
local v = redis.call('HMGET', KEYS[1], 's', 't')
if v[1] ~= '1' or v[2] ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 's', '2', 'r', ARGV[2])
redis.call('HDEL', KEYS[1], 't')
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
`)

// releaseScript: KEYS[1] record; ARGV token. It returns 1 when deleted.
var releaseScript = redis.NewScript(`
local v = redis.call('HMGET', KEYS[1], 's', 't')
if v[1] ~= '1' or v[2] ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
`)

// extendScript: KEYS[1] record; ARGV token, lease ms. It returns 1 when renewed.
var extendScript = redis.NewScript(`
local v = redis.call('HMGET', KEYS[1], 's', 't')
if v[1] ~= '1' or v[2] ~= ARGV[1] then
  return 0
end
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

// Acquire implements [idem.Store.Acquire] with one script run.
func (s *Store) Acquire(ctx context.Context, key, token, fingerprint string, lease time.Duration) (idem.Record, bool, error) {
	if err := ctx.Err(); err != nil {
		return idem.Record{}, false, err
	}
	if lease <= 0 {
		return idem.Record{}, false, idem.ErrInvalidDuration
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	v, err := acquireScript.Run(ctx, s.c, []string{s.prefix + key}, token, fingerprint, millis(lease)).Slice()
	if err != nil {
		return idem.Record{}, false, fmt.Errorf("redisstore: acquire: %w", foreign(err))
	}
	if len(v) == 0 {
		return idem.Record{}, true, nil
	}
	rec, found, err := parseRecord(v)
	if err != nil {
		return idem.Record{}, false, fmt.Errorf("redisstore: acquire: %w", err)
	}
	if !found {
		return idem.Record{}, false, fmt.Errorf("redisstore: acquire: %w: no state", ErrCorrupt)
	}
	return rec, false, nil
}

// Complete implements [idem.Store.Complete] with one script run; under
// [WithWaitReplicas] the script and WAIT share one pipeline. A response
// whose encoding exceeds 512 MiB (Redis's default proto-max-bulk-len) is
// refused with an error wrapping [idem.ErrTooLarge] before any I/O.
func (s *Store) Complete(ctx context.Context, key, token string, resp *idem.Response, retention time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if retention <= 0 {
		return idem.ErrInvalidDuration
	}
	if resp == nil {
		return errors.New("redisstore: complete: nil response")
	}
	enc, err := resp.AppendBinary(nil)
	if err != nil {
		return fmt.Errorf("redisstore: complete: %w", err)
	}
	if len(enc) > maxBulk {
		return fmt.Errorf("redisstore: complete: %w: %d-byte encoded response, Redis accepts at most 512 MiB", idem.ErrTooLarge, len(enc))
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	k := s.prefix + key
	args := []any{token, enc, millis(retention)}
	if s.waitN > 0 {
		return s.completeAndWait(ctx, k, args)
	}
	ok, err := completeScript.Run(ctx, s.c, []string{k}, args...).Int64()
	if err != nil {
		return fmt.Errorf("redisstore: complete: %w", err)
	}
	if ok != 1 {
		return idem.ErrNotOwner
	}
	return nil
}

// completeAndWait runs the completion script and WAIT in one pipeline, on
// the master owning k when the client is a Cluster client. WAIT counts the
// replicas that acknowledged the writes of the connection it is sent on, so
// both commands must share one connection: a pipeline to one node.
func (s *Store) completeAndWait(ctx context.Context, k string, args []any) error {
	var c redis.Cmdable = s.c
	cluster, isCluster := s.c.(*redis.ClusterClient)
	if isCluster {
		node, err := cluster.MasterForKey(ctx, k)
		if err != nil {
			return fmt.Errorf("redisstore: complete: %w", err)
		}
		c = node
	}
	res, acked, err := s.pipeCompleteWait(ctx, c, k, args, false)
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
		res, acked, err = s.pipeCompleteWait(ctx, node, k, args, ask)
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
func (s *Store) pipeCompleteWait(ctx context.Context, c redis.Cmdable, k string, args []any, ask bool) (res, acked int64, err error) {
	res, acked, err = s.pipeOnce(ctx, c, k, args, ask, false)
	if redis.HasErrorPrefix(err, "NOSCRIPT") {
		res, acked, err = s.pipeOnce(ctx, c, k, args, ask, true)
	}
	return res, acked, err
}

func (s *Store) pipeOnce(ctx context.Context, c redis.Cmdable, k string, args []any, ask, source bool) (res, acked int64, err error) {
	pipe := c.Pipeline()
	if ask {
		pipe.Do(ctx, "asking")
	}
	var run *redis.Cmd
	if source {
		run = completeScript.Eval(ctx, pipe, []string{k}, args...)
	} else {
		run = completeScript.EvalSha(ctx, pipe, []string{k}, args...)
	}
	wait := pipe.Do(ctx, "wait", s.waitN, s.waitTimeout.Milliseconds())
	_, _ = pipe.Exec(ctx)
	if res, err = run.Int64(); err != nil {
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
	ok, err := releaseScript.Run(ctx, s.c, []string{s.prefix + key}, token).Int64()
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
	ok, err := extendScript.Run(ctx, s.c, []string{s.prefix + key}, token, millis(lease)).Int64()
	if err != nil {
		return fmt.Errorf("redisstore: extend: %w", err)
	}
	if ok != 1 {
		return idem.ErrNotOwner
	}
	return nil
}

// Get implements [idem.Store.Get] with one HMGET. With a Cluster client
// configured to read from replicas (ReadOnly, RouteByLatency, RouteRandomly)
// it may return a slightly stale record; the engine never calls Get.
func (s *Store) Get(ctx context.Context, key string) (idem.Record, bool, error) {
	if err := ctx.Err(); err != nil {
		return idem.Record{}, false, err
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	v, err := s.c.HMGet(ctx, s.prefix+key, "s", "t", "f", "r").Result()
	if err != nil {
		return idem.Record{}, false, fmt.Errorf("redisstore: get: %w", foreign(err))
	}
	rec, found, err := parseRecord(v)
	if err != nil {
		return idem.Record{}, false, fmt.Errorf("redisstore: get: %w", err)
	}
	return rec, found, nil
}

// foreign wraps err in ErrCorrupt when Redis refused the command because the
// key holds another type than a hash (WRONGTYPE, also from inside a script).
func foreign(err error) error {
	var rerr redis.Error
	if errors.As(err, &rerr) && strings.Contains(rerr.Error(), "WRONGTYPE") {
		return fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return err
}

// parseRecord decodes the reply {s, t, f, r} of HMGET; found is false when
// the key has no state (absent or expired).
func parseRecord(v []any) (idem.Record, bool, error) {
	if len(v) != 4 {
		return idem.Record{}, false, fmt.Errorf("%w: %d fields", ErrCorrupt, len(v))
	}
	if v[0] == nil || v[0] == false {
		return idem.Record{}, false, nil
	}
	state, _ := v[0].(string)
	token, _ := v[1].(string)
	fp, _ := v[2].(string)
	switch state {
	case stateInProgress:
		return idem.Record{State: idem.StateInProgress, Fingerprint: fp, Token: token}, true, nil
	case stateCompleted:
		r, ok := v[3].(string)
		if !ok {
			return idem.Record{}, false, fmt.Errorf("%w: completed without a response", ErrCorrupt)
		}
		resp := new(idem.Response)
		if err := resp.UnmarshalBinary([]byte(r)); err != nil {
			return idem.Record{}, false, fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
		return idem.Record{State: idem.StateCompleted, Fingerprint: fp, Token: token, Response: resp}, true, nil
	}
	return idem.Record{}, false, fmt.Errorf("%w: state %q", ErrCorrupt, state)
}
