package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemkit/idem/core"
)

// Record values. Each record is one Redis string at prefix+key:
//
//	in-progress       '1' lp(token) lp(fingerprint)                  TTL lease
//	completed         '2' lp(fingerprint) response                   TTL retention
//	in-progress, kept '3' lp(token) lp(fingerprint) lp(u) lp(t)      TTL lease + u
//	completed, kept   '4' lp(fingerprint) lp(t)                      TTL retention + t
//	in-progress, steps '5' lp(token) lp(fingerprint) lp(u) lp(t) lp(r) TTL lease + (u, else r)
//
// where lp(s) is len(s) in decimal ASCII digits (no leading zero), ':' and
// the bytes of s, so that tokens and fingerprints may hold any byte, and
// response is the bytes given to Complete (the engine's encoding of the
// response, never empty), to the end of the value. '1' and '2' are the
// records of the zero [idem.Keep] (the layout of earlier versions); '3'
// and '4' carry a non-zero Keep: u is Keep.Uncertain and t Keep.Tombstone
// in decimal milliseconds ("0" for none). A '3' record's lease has lapsed,
// and the record is uncertain, when its PTTL is <= u (the Redis server's
// clock alone decides). A '4' record keeps its response in a second key,
// the response key ([Store.appendKeys]), whose TTL is the retention: it is
// completed while that key lives and a tombstone (expired) after. A '5'
// record has a step journal ([idem.Journal]) in its journal key
// ([Store.journalKeys]): r is the journal's retain in milliseconds, and
// its lease has lapsed when its PTTL is at most its lapse, u when u > 0
// (then it is uncertain, as a '3' record) else r (then it is in progress,
// lapsed: taken over by an Acquire of its fingerprint). The
// owner check of Release and Extend decodes the value and compares its
// token with the caller's; Complete first compares the value's start with
// '1' lp(token) and, when it matches, takes lp(fingerprint) as the rest of
// the value (a '1' value with the caller's token), decoding only other
// values.
const (
	stateInProgress        = '1'
	stateCompleted         = '2'
	stateInProgressKept    = '3'
	stateCompletedKept     = '4'
	stateInProgressJournal = '5'
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

// appendLPInt appends lp of n (>= 0) in decimal.
func appendLPInt(b []byte, n int64) []byte {
	b = strconv.AppendInt(b, int64(decimalLen(int(n))), 10)
	b = append(b, ':')
	return strconv.AppendInt(b, n, 10)
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

// maxKeepDigits bounds the decimal length of a keep in milliseconds (u, t):
// 15 digits, exact in Lua's numbers (doubles) and in an int64.
const maxKeepDigits = 15

// cutMillis reads lp(decimal) at the start of v: a keep in milliseconds.
func cutMillis(v string) (ms int64, rest string, ok bool) {
	d, rest, ok := cutLP(v)
	if !ok || d == "" || len(d) > maxKeepDigits || strings.Trim(d, "0123456789") != "" {
		return 0, "", false
	}
	ms, err := strconv.ParseInt(d, 10, 64)
	return ms, rest, err == nil
}

// stored is a decoded record value. rec.State is StateInProgress ('1',
// '3') or StateCompleted ('2', '4'): a kept value's state also depends on
// its TTL and its response key ([stored.at]); a '4' value's Response is
// nil.
type stored struct {
	rec     idem.Record
	kept    bool  // a '3', '4' or '5' value
	journal bool  // a '5' value
	u, t    int64 // its Keep.Uncertain and Keep.Tombstone in milliseconds
	r       int64 // a '5' value's journal retain in milliseconds
}

// lapse returns how long an in-progress value outlives its lease, in
// milliseconds: u, else a '5' value's r.
func (st stored) lapse() int64 {
	if st.u == 0 && st.journal {
		return st.r
	}
	return st.u
}

// parseValue decodes a record value. The token and fingerprint share the
// memory of v, and so does a completed record's Response: a view of v's
// memory, read-only (Acquire hands it out as is; Get and Inspect copy it).
func parseValue(v string) (stored, error) {
	if v == "" {
		return stored{}, fmt.Errorf("%w: empty value", ErrCorrupt)
	}
	switch v[0] {
	case stateInProgress, stateInProgressKept, stateInProgressJournal:
		token, rest, ok := cutLP(v[1:])
		if !ok {
			break
		}
		fp, rest, ok := cutLP(rest)
		if !ok {
			break
		}
		st := stored{rec: idem.Record{State: idem.StateInProgress, Fingerprint: fp, Token: token}}
		if v[0] != stateInProgress {
			st.kept, st.journal = true, v[0] == stateInProgressJournal
			if st.u, rest, ok = cutMillis(rest); !ok {
				break
			}
			if st.t, rest, ok = cutMillis(rest); !ok {
				break
			}
			if st.journal {
				if st.r, rest, ok = cutMillis(rest); !ok {
					break
				}
			}
		}
		if rest != "" {
			break
		}
		return st, nil
	case stateCompleted:
		fp, rest, ok := cutLP(v[1:])
		if !ok || rest == "" {
			break
		}
		return stored{rec: idem.Record{State: idem.StateCompleted, Fingerprint: fp, Response: unsafe.Slice(unsafe.StringData(rest), len(rest))}}, nil
	case stateCompletedKept:
		fp, rest, ok := cutLP(v[1:])
		if !ok {
			break
		}
		st := stored{rec: idem.Record{State: idem.StateCompleted, Fingerprint: fp}, kept: true}
		if st.t, rest, ok = cutMillis(rest); !ok || rest != "" {
			break
		}
		return st, nil
	}
	return stored{}, fmt.Errorf("%w: a %d-byte string that is not a record", ErrCorrupt, len(v))
}

// at returns the record a value reads as when its key's PTTL is pttl
// (milliseconds, > 0) and, for a '4' value, its response key holds resp
// (hasResp) with PTTL respTTL; and the record's time to live
// ([idem.RecordInfo.TTL]). A '3' or '5' value is in progress while pttl
// is above its lapse (LeaseLeft pttl - lapse), else uncertain, or, for a
// '5' value with no u, in progress with its lease lapsed (LeaseLeft 0, TTL
// pttl: kept for its journal); a '4' value is completed while its
// response key lives (the response, a view of resp), else expired: a
// tombstone.
func (st stored) at(pttl int64, resp string, hasResp bool, respTTL int64) (idem.Record, time.Duration) {
	rec, ttl := st.rec, pttl
	switch {
	case !st.kept:
	case rec.State == idem.StateInProgress && pttl > st.lapse():
		ttl = pttl - st.lapse()
	case rec.State == idem.StateInProgress && st.u == 0: // a '5' value, lapsed: the time since the lease's end, < 0
		return rec, time.Duration(ttl-st.lapse()) * time.Millisecond
	case rec.State == idem.StateInProgress:
		rec.State = idem.StateUncertain
	case hasResp:
		rec.Response, ttl = unsafe.Slice(unsafe.StringData(resp), len(resp)), respTTL
	default:
		rec.State = idem.StateExpired
	}
	if rec.State == idem.StateInProgress {
		rec.LeaseLeft = time.Duration(max(ttl, 1)) * time.Millisecond
	}
	return rec, time.Duration(ttl) * time.Millisecond
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

// setCmd holds the arguments of SET key value PX ms NX GET, and the raw
// command of its first attempt (see rawCommand): one allocation for both.
type setCmd struct {
	raw             redis.RawCmd
	sent            bool // raw was handed out
	args            [7]any
	key, value, ttl string
}

// newAcquire returns the arguments of Acquire's SET under the keep u, t
// (milliseconds): the in-progress value of token and fingerprint under key
// ('1' for the zero keep, else '3' with u and t), NX, GET, PX lease + u.
func newAcquire(prefix, key, token, fingerprint string, leaseMillis, u, t int64) *setCmd {
	kept := u != 0 || t != 0
	size := len(prefix) + len(key) + 1 + lpLen(token) + lpLen(fingerprint) + 20
	if kept {
		size += 2 * (3 + maxKeepDigits)
	}
	buf := make([]byte, 0, size)
	buf = append(append(buf, prefix...), key...)
	k := len(buf)
	if !kept && t == 0 {
		buf = appendLP(appendLP(append(buf, stateInProgress), token), fingerprint)
	} else {
		buf = appendLP(appendLP(append(buf, stateInProgressKept), token), fingerprint)
		buf = appendLPInt(appendLPInt(buf, u), t)
	}
	v := len(buf)
	buf = strconv.AppendInt(buf, leaseMillis+u, 10)
	all := view(buf)
	c := &setCmd{key: all[:k], value: all[k:v], ttl: all[v:]}
	c.args = [7]any{"set", &c.key, &c.value, "px", &c.ttl, "nx", "get"}
	return c
}

// rawCommand returns the SET as a raw command (its reply unparsed): the
// one c holds on the first call, a new one after; each attempt needs its
// own.
func (c *setCmd) rawCommand(ctx context.Context) *redis.RawCmd {
	cmd := &c.raw
	if c.sent {
		cmd = new(redis.RawCmd)
	}
	c.sent = true
	*cmd = *redis.NewRawCmd(ctx, c.args[:]...)
	cmd.SetFirstKeyPos(1)
	return cmd
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

// evalCmd holds the arguments of EVALSHA sha numkeys key... argv...: up
// to five keys and arguments in all (no more than the two-key completion
// needs, for the size of the struct: 336 bytes, allocated on every
// completion), and the command of its first attempt (see command).
type evalCmd struct {
	first redis.IntCmd
	sent  bool // first was handed out
	args  [8]any
	strs  [5]string
	n     int
}

// newEval returns EVALSHA sc numKeys KEYS... ARGV... where buf holds each
// key and then each ARGV, back to back, ending at the offsets ends
// (len(ends) <= 5).
func newEval(sc *script, numKeys int, buf []byte, ends ...int) *evalCmd {
	all := view(buf)
	c := &evalCmd{n: 3 + len(ends)}
	c.args[0], c.args[1], c.args[2] = "evalsha", sc.shaArg, numKeys
	start := 0
	for i, end := range ends {
		c.strs[i] = all[start:end]
		c.args[3+i] = &c.strs[i]
		start = end
	}
	return c
}

// command returns an EVALSHA command, or EVAL with the script's source
// when source is set: the one c holds on the first call, a new one after;
// each attempt needs its own.
func (c *evalCmd) command(ctx context.Context, sc *script, source bool) *redis.IntCmd {
	args := c.args[:c.n:c.n]
	if source {
		args = append([]any{"eval", sc.srcArg}, args[2:]...)
	}
	cmd := &c.first
	if c.sent {
		cmd = new(redis.IntCmd)
	}
	c.sent = true
	*cmd = *redis.NewIntCmd(ctx, args...)
	cmd.SetFirstKeyPos(3)
	return cmd
}
