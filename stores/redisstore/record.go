package redisstore

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"unsafe"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemkit/idem/core"
)

// Record values. Each record is one Redis string at prefix+key:
//
//	in-progress  '1' lp(token) lp(fingerprint)
//	completed    '2' lp(fingerprint) response
//
// where lp(s) is len(s) in decimal ASCII digits (no leading zero), ':' and
// the bytes of s, so that tokens and fingerprints may hold any byte, and
// response is the bytes given to Complete (the engine's encoding of the
// response, never empty), to the end of the value. The owner check of Complete, Release and Extend compares the
// value's start with '1' lp(token): the token's length is part of the match,
// so no other token (nor a completed record) can match it.
const (
	stateInProgress = '1'
	stateCompleted  = '2'
)

// maxLenDigits bounds the decimal length of lp(s): lengths fit in an int.
const maxLenDigits = 10

// appendLP appends lp(s): len(s) in decimal, ':' and s.
func appendLP(b []byte, s string) []byte {
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, ':')
	return append(b, s...)
}

// lpLen is len(lp(s)).
func lpLen(s string) int { return decimalLen(len(s)) + 1 + len(s) }

func decimalLen(n int) int {
	d := 1
	for ; n >= 10; n /= 10 {
		d++
	}
	return d
}

// appendOwner appends '1' lp(token): the start of every in-progress value
// token owns.
func appendOwner(b []byte, token string) []byte {
	return appendLP(append(b, stateInProgress), token)
}

// cutLP reads lp(s) at the start of v and returns s and what follows it.
func cutLP(v string) (s, rest string, ok bool) {
	i := 0
	n := 0
	for ; i < len(v) && i <= maxLenDigits && v[i] >= '0' && v[i] <= '9'; i++ {
		n = n*10 + int(v[i]-'0')
	}
	if i == 0 || i > maxLenDigits || i == len(v) || v[i] != ':' || (v[0] == '0' && i > 1) {
		return "", "", false
	}
	rest = v[i+1:]
	if n > len(rest) {
		return "", "", false
	}
	return rest[:n], rest[n:], true
}

// parseValue decodes a record value. The token and fingerprint share the
// memory of v, and so does a completed record's Response: a view of v's
// memory, read-only (Acquire hands it out as is; Get and Inspect copy it).
func parseValue(v string) (idem.Record, error) {
	if v == "" {
		return idem.Record{}, fmt.Errorf("%w: empty value", ErrCorrupt)
	}
	switch v[0] {
	case stateInProgress:
		token, rest, ok := cutLP(v[1:])
		if !ok {
			break
		}
		fp, rest, ok := cutLP(rest)
		if !ok || rest != "" {
			break
		}
		return idem.Record{State: idem.StateInProgress, Fingerprint: fp, Token: token}, nil
	case stateCompleted:
		fp, rest, ok := cutLP(v[1:])
		if !ok || rest == "" {
			break
		}
		return idem.Record{State: idem.StateCompleted, Fingerprint: fp, Response: unsafe.Slice(unsafe.StringData(rest), len(rest))}, nil
	}
	return idem.Record{}, fmt.Errorf("%w: a %d-byte string that is not a record", ErrCorrupt, len(v))
}

// parseCopy is parseValue with the Response copied, the caller's to modify.
func parseCopy(v string) (idem.Record, error) {
	rec, err := parseValue(v)
	rec.Response = bytes.Clone(rec.Response)
	return rec, err
}

// Commands are built with their arguments in two allocations, whatever
// their number: one buffer holding every variable argument back to back,
// and one struct holding the []any go-redis sends and the strings (views of
// the buffer) its elements point to. A *string goes into an interface
// without allocating, where a string or a []byte would allocate each.

// view returns the bytes of buf as a string without copying; buf must not
// change afterwards.
func view(buf []byte) string { return unsafe.String(unsafe.SliceData(buf), len(buf)) }

// parseBulkReply decodes the raw RESP reply b to a SET with GET: a bulk
// string (old, exists) or a null (RESP2 "$-1", RESP3 "_": !exists). ok is
// false for any other reply (an error). old shares the memory of b.
func parseBulkReply(b []byte) (old string, exists, ok bool) {
	if len(b) < 3 || b[len(b)-2] != '\r' || b[len(b)-1] != '\n' {
		return "", false, false
	}
	switch b[0] {
	case '_':
		return "", false, len(b) == 3
	case '$':
		if string(b) == "$-1\r\n" {
			return "", false, true
		}
		i, n := 1, 0
		for ; i < len(b) && i <= maxLenDigits && b[i] >= '0' && b[i] <= '9'; i++ {
			n = n*10 + int(b[i]-'0')
		}
		if i == 1 || i > maxLenDigits || len(b) != i+2+n+2 || b[i] != '\r' {
			return "", false, false
		}
		return view(b[i+2 : i+2+n]), true, true
	}
	return "", false, false
}

// setCmd holds the arguments of SET key value PX ms NX GET.
type setCmd struct {
	args            [7]any
	key, value, ttl string
}

// newAcquire returns the arguments of Acquire's SET: the in-progress value
// of token and fingerprint under key, NX, GET, PX lease.
func newAcquire(prefix, key, token, fingerprint string, leaseMillis int64) *setCmd {
	buf := make([]byte, 0, len(prefix)+len(key)+1+lpLen(token)+lpLen(fingerprint)+20)
	buf = append(append(buf, prefix...), key...)
	k := len(buf)
	buf = appendLP(appendOwner(buf, token), fingerprint)
	v := len(buf)
	buf = strconv.AppendInt(buf, leaseMillis, 10)
	all := view(buf)
	c := &setCmd{key: all[:k], value: all[k:v], ttl: all[v:]}
	c.args = [7]any{"set", &c.key, &c.value, "px", &c.ttl, "nx", "get"}
	return c
}

// command returns a new SET command; each attempt needs its own.
func (c *setCmd) command(ctx context.Context) *redis.StringCmd {
	cmd := redis.NewStringCmd(ctx, c.args[:]...)
	cmd.SetFirstKeyPos(1)
	return cmd
}

// script is a Lua script run with EVALSHA, and with EVAL when the server's
// script cache lacks it. srcArg and shaArg hold src and sha boxed once, for
// the hot paths.
type script struct {
	src, sha       string
	srcArg, shaArg any
}

func newScript(src string) *script {
	sha := redis.NewScript(src).Hash()
	return &script{src: src, sha: sha, srcArg: src, shaArg: sha}
}

// evalCmd holds the arguments of EVALSHA sha 1 key argv...: up to three
// arguments.
type evalCmd struct {
	args [7]any
	strs [4]string
	n    int
}

// newEval returns EVALSHA sc 1 KEYS[1] ARGV... where buf holds KEYS[1] and
// then each ARGV, ending at the offsets ends (len(ends) <= 4).
func newEval(sc *script, buf []byte, ends ...int) *evalCmd {
	all := view(buf)
	c := &evalCmd{n: 3 + len(ends)}
	c.args[0], c.args[1], c.args[2] = "evalsha", sc.shaArg, 1
	start := 0
	for i, end := range ends {
		c.strs[i] = all[start:end]
		c.args[3+i] = &c.strs[i]
		start = end
	}
	return c
}

// command returns a new EVALSHA command, or EVAL with the script's source
// when source is set; each attempt needs its own.
func (c *evalCmd) command(ctx context.Context, sc *script, source bool) *redis.IntCmd {
	args := c.args[:c.n:c.n]
	if source {
		args = append([]any{"eval", sc.srcArg}, args[2:]...)
	}
	cmd := redis.NewIntCmd(ctx, args...)
	cmd.SetFirstKeyPos(3)
	return cmd
}

// keyAndOwner returns a buffer holding prefix+key and then '1' lp(token),
// with room for extra more bytes, and the offsets where each ends.
func keyAndOwner(prefix, key, token string, extra int) (buf []byte, keyEnd, ownerEnd int) {
	buf = make([]byte, 0, len(prefix)+len(key)+1+lpLen(token)+extra)
	buf = append(append(buf, prefix...), key...)
	keyEnd = len(buf)
	buf = appendOwner(buf, token)
	return buf, keyEnd, len(buf)
}
