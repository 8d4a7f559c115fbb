package idem

import (
	"crypto/sha256"
	"encoding/binary"
	"math"
	"net/url"
	"slices"
	"strings"
)

// Fingerprint returns the request fingerprint: the hex SHA-256 (64 characters)
// over the method, path, query parameters, media type (lower-cased, spaces
// removed) and raw body. A reused idempotency key whose fingerprint differs
// from the stored one is answered with 422 (IETF draft "The Idempotency-Key
// HTTP Header Field" section 2.7; Stripe compares endpoint and parameters the
// same way).
//
// The query is compared as a handler reads it, with [url.ParseQuery]
// semantics: two queries fingerprint alike exactly when they parse to the
// same names with the same values in the same order. So the order of
// distinct names, "+" or "%20" for a space, percent-encoding ("%61" or "a"),
// "a" or "a=" and empty pairs ("a=1&&b=2") don't matter; the order of the
// values of one name ("a=1&a=2" is not "a=2&a=1") and every decoded byte do.
// A query ParseQuery rejects (a bad escape, a ";") is compared byte for byte.
func Fingerprint(method, path, rawQuery, contentType string, body []byte) string {
	return hexSum(fingerprintSum(method, path, rawQuery, contentType, body))
}

// fingerprintSum is [Fingerprint] before hex encoding.
func fingerprintSum(method, path, rawQuery, contentType string, body []byte) [sha256.Size]byte {
	var stack [1024]byte
	b := appendField(stack[:0], method)
	b = appendField(b, path)
	b = appendQuery(b, rawQuery)
	b = appendField(b, normalizeMediaType(contentType))
	if len(b)+len(body) <= cap(stack) { // small request: hash on the stack
		return sha256.Sum256(append(b, body...))
	}
	h := sha256.New()
	h.Write(b)
	h.Write(body)
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

// queryParam is one name=value pair of a query: name decoded, value raw.
type queryParam struct{ name, value string }

// rawQueryMark replaces the pair count of a query that does not parse; no
// query has that many pairs.
const rawQueryMark = math.MaxUint64

// appendQuery appends the canonical form of rawQuery: the pair count, then
// each decoded name and value, length-prefixed (the count keeps the query
// from spilling into later fields), the pairs ordered by name and, within a
// name, as sent: what url.ParseQuery's ordered url.Values hold. A query
// that does not parse is appended raw after [rawQueryMark].
func appendQuery(b []byte, rawQuery string) []byte {
	var stack [16]queryParam
	ps := stack[:0]
	for q := rawQuery; q != ""; {
		var kv string
		kv, q, _ = strings.Cut(q, "&")
		if kv == "" {
			continue
		}
		name, value, _ := strings.Cut(kv, "=")
		var err error
		if strings.IndexByte(kv, ';') >= 0 || !validEscapes(value) {
			return appendField(binary.AppendUvarint(b, rawQueryMark), rawQuery)
		}
		if name, err = url.QueryUnescape(name); err != nil {
			return appendField(binary.AppendUvarint(b, rawQueryMark), rawQuery)
		}
		ps = append(ps, queryParam{name, value})
	}
	slices.SortStableFunc(ps, func(x, y queryParam) int { return strings.Compare(x.name, y.name) })
	b = binary.AppendUvarint(b, uint64(len(ps)))
	for _, p := range ps {
		b = appendField(b, p.name)
		b = appendUnescaped(b, p.value)
	}
	return b
}

// validEscapes reports whether every "%" in s starts a two-digit hex escape,
// the only check url.QueryUnescape makes.
func validEscapes(s string) bool {
	for i := strings.IndexByte(s, '%'); i >= 0; i = strings.IndexByte(s, '%') {
		if i+2 >= len(s) || !isHex(s[i+1]) || !isHex(s[i+2]) {
			return false
		}
		s = s[i+3:]
	}
	return true
}

// appendUnescaped appends s decoded as url.QueryUnescape does ("+" is a
// space, "%XX" a byte), length-prefixed like appendField, without
// allocating. s has valid escapes.
func appendUnescaped(b []byte, s string) []byte {
	if strings.IndexByte(s, '%') < 0 && strings.IndexByte(s, '+') < 0 {
		return appendField(b, s)
	}
	n := len(s) - 2*strings.Count(s, "%")
	b = binary.AppendUvarint(b, uint64(n))
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '%':
			b = append(b, unhex(s[i+1])<<4|unhex(s[i+2]))
			i += 2
		case '+':
			b = append(b, ' ')
		default:
			b = append(b, c)
		}
	}
	return b
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}

// ScopedKey returns the key a [Store] sees: the hex SHA-256 (64 characters) of
// the scope (principal, method, route template) and the idempotency key, so
// that the same key sent by two principals or to two endpoints names two
// records (IETF draft section 4, "Security Considerations"), and raw keys never
// reach the store or the logs.
func ScopedKey(principal, method, route, key string) string {
	return hexSum(scopedSum(principal, method, route, key))
}

// scopedSum is [ScopedKey] before hex encoding.
func scopedSum(principal, method, route, key string) [sha256.Size]byte {
	var stack [512]byte
	b := appendField(stack[:0], principal)
	b = appendField(b, method)
	b = appendField(b, route)
	b = appendField(b, key)
	return sha256.Sum256(b)
}

// appendField appends s length-prefixed, so that field boundaries can't be forged.
func appendField(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// hexSum returns sum in lower-case hex with one allocation.
func hexSum(sum [sha256.Size]byte) string {
	var dst [2 * sha256.Size]byte
	return string(appendHex(dst[:0], sum))
}

// appendHex appends sum in lowercase hex (64 characters) to b, as
// hex.AppendEncode does, a byte pair per table lookup (a quarter of its
// instructions; two of these run per request).
func appendHex(b []byte, sum [sha256.Size]byte) []byte {
	n := len(b)
	b = slices.Grow(b, 2*sha256.Size)[:n+2*sha256.Size]
	d := b[n:]
	for i, c := range sum {
		d[2*i], d[2*i+1] = hexPairs[2*int(c)], hexPairs[2*int(c)+1]
	}
	return b
}

// hexPairs holds the two lowercase hex digits of every byte value.
var hexPairs = func() (t [512]byte) {
	const digits = "0123456789abcdef"
	for i := range 256 {
		t[2*i], t[2*i+1] = digits[i>>4], digits[i&15]
	}
	return t
}()

func normalizeMediaType(ct string) string {
	clean := true
	for i := 0; i < len(ct); i++ {
		if c := ct[i]; c == ' ' || c == '\t' || ('A' <= c && c <= 'Z') {
			clean = false
			break
		}
	}
	if clean {
		return ct
	}
	b := make([]byte, 0, len(ct))
	for i := 0; i < len(ct); i++ {
		c := ct[i]
		switch {
		case c == ' ' || c == '\t':
			continue
		case 'A' <= c && c <= 'Z':
			c += 'a' - 'A'
		}
		b = append(b, c)
	}
	return string(b)
}
