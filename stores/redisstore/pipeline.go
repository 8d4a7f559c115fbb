package redisstore

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// send runs cmd on the per-record path: batched with the commands of
// concurrent calls (see batcher), or, under [WithoutBatching], with the
// client's Process. It returns a non-nil error only when ctx ended before
// cmd's reply came (see batcher.send); cmd must not be read then.
// Otherwise cmd holds its reply or error, as after Process.
func (s *Store) send(ctx context.Context, cmd redis.Cmder) error {
	if s.b == nil {
		_ = s.c.Process(ctx, cmd)
		return nil
	}
	return s.b.send(ctx, cmd)
}

// evalScript runs sc on keys and args on the per-record path (see send)
// with EVALSHA, and once more with EVAL when the server's script cache
// lacks it. Its command's error is ctx's when ctx ended first.
func (s *Store) evalScript(ctx context.Context, sc *script, keys []string, args ...any) *redis.Cmd {
	if s.b == nil {
		cmd := s.c.EvalSha(ctx, sc.sha, keys, args...)
		if isNoScript(cmd.Err()) {
			cmd = s.c.Eval(ctx, sc.src, keys, args...)
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
