package redisstore

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// AutoPipelineOptions returns the options to take a client's asynchronous
// auto-pipeliner with for [WithPipeliner]: go-redis's DefaultAutoPipelineOptions with
// a MaxFlushDelay of 1ns. That turns off go-redis's default coalescing
// wait, which holds a command queued behind a batch in flight for up to
// three "silence gaps" of 200µs to 2ms each, waiting for more callers:
// the commands of an HTTP service arrive between handler runs, not in
// waves, and the wait cost a service at 8 concurrent requests most of its
// requests/s (stores/redisstore README, Pipelining). Batches still form:
// the commands that arrive while a batch is in flight go together in the
// next one. Use it as WithPipeliner(ap), with ap from
// client.AsyncAutoPipelineWithOptions(AutoPipelineOptions()).
func AutoPipelineOptions() *redis.AutoPipelineOptions {
	o := redis.DefaultAutoPipelineOptions()
	o.MaxFlushDelay = time.Nanosecond
	return o
}

// pipeliner returns the asynchronous auto-pipeliner given to
// [WithPipeliner] that the store's commands on one record go through, or
// nil when they go to s.p with Process.
func (s *Store) pipeliner() *redis.AutoPipeliner { return s.ap }

// send runs cmd on the per-record path: queued on the auto-pipeliner
// (see pipeliner), or with s.p's Process. It returns a non-nil error only
// when ctx ended before cmd's reply came: the command was then abandoned
// (it may still run on the server, as a command whose reply a timed-out
// client stops reading does) and cmd must not be read. Otherwise cmd
// holds its reply or error, as after Process.
//
// An auto-pipeliner does not end a queued command when its context ends;
// the store stops waiting for it instead (AutoFuture.WaitContext), so the
// store's timeout and the caller's context bound every call, whatever the
// client's ContextTimeoutEnabled, ReadTimeout and WriteTimeout.
func (s *Store) send(ctx context.Context, cmd redis.Cmder) error {
	ap := s.pipeliner()
	if ap == nil {
		_ = s.p.Process(ctx, cmd)
		return nil
	}
	// A command whose reply is not awaited may go out after the call
	// returned, when the caller may have reused the memory of its
	// arguments: a []byte argument (a caller's response or step result;
	// the store's own buffers are strings it never reuses) goes as a copy.
	args := cmd.Args()
	for i, a := range args {
		if b, ok := a.([]byte); ok {
			args[i] = bytes.Clone(b)
		}
	}
	err := ap.Submit(ctx, cmd).WaitContext(ctx)
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("%w (the command was sent or queued; its reply was not awaited)", ctx.Err())
	}
	return nil
}

// evalScript runs sc on keys and args on the per-record path (see send)
// with EVALSHA, and once more with EVAL when the server's script cache
// lacks it. Its command's error is ctx's when ctx ended first.
func (s *Store) evalScript(ctx context.Context, sc *script, keys []string, args ...any) *redis.Cmd {
	if s.pipeliner() == nil {
		cmd := s.p.EvalSha(ctx, sc.sha, keys, args...)
		if isNoScript(cmd.Err()) {
			cmd = s.p.Eval(ctx, sc.src, keys, args...)
		}
		return cmd
	}
	// Built by a pipeline that is never executed: go-redis's own argument
	// flattening for args, as the client's EvalSha.
	pipe := s.c.Pipeline()
	cmd := pipe.EvalSha(ctx, sc.sha, keys, args...)
	if err := s.send(ctx, cmd); err != nil {
		return abandoned(ctx, err)
	}
	if isNoScript(cmd.Err()) {
		cmd = pipe.Eval(ctx, sc.src, keys, args...)
		if err := s.send(ctx, cmd); err != nil {
			return abandoned(ctx, err)
		}
	}
	return cmd
}

// abandoned returns a command holding err, for a caller that reads a
// command whose reply send did not await.
func abandoned(ctx context.Context, err error) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(err)
	return cmd
}

// pttl returns the PTTL of key, sent on the per-record path.
func (s *Store) pttl(ctx context.Context, key string) (time.Duration, error) {
	cmd := redis.NewDurationCmd(ctx, time.Millisecond, "pttl", key)
	cmd.SetFirstKeyPos(1)
	if err := s.send(ctx, cmd); err != nil {
		return 0, err
	}
	return cmd.Result()
}

// get returns the value at key, sent on the per-record path (redis.Nil
// for no key).
func (s *Store) get(ctx context.Context, key string) (string, error) {
	cmd := redis.NewStringCmd(ctx, "get", key)
	cmd.SetFirstKeyPos(1)
	if err := s.send(ctx, cmd); err != nil {
		return "", err
	}
	return cmd.Result()
}

// sendAcquire runs Acquire's SET on the per-record path and, unlike send,
// waits for its reply even past ctx's end (bounded by the client's own
// dial, read and write timeouts, as a plain client's call is): a SET that
// went out after the store stopped waiting would leave an in-progress
// record under a token no request holds, answered 409 until its lease
// lapses, to the retries of a request the engine answered 503.
func (s *Store) sendAcquire(ctx context.Context, cmd redis.Cmder) {
	ap := s.pipeliner()
	if ap == nil {
		_ = s.p.Process(ctx, cmd)
		return
	}
	_ = ap.Submit(ctx, cmd).Wait()
}
