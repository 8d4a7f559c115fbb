package idem

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"slices"
	"strings"
)

// Fingerprint returns the request fingerprint: the hex SHA-256 (64 characters)
// over the method, path, query parameters in any order, media type (lower-cased,
// spaces removed) and raw body. A reused idempotency key whose fingerprint
// differs from the stored one is answered with 422 (IETF draft "The
// Idempotency-Key HTTP Header Field" section 2.7; Stripe compares endpoint and
// parameters the same way).
func Fingerprint(method, path, rawQuery, contentType string, body []byte) string {
	var stack [1024]byte
	b := appendField(stack[:0], method)
	b = appendField(b, path)
	switch {
	case rawQuery == "":
		b = binary.AppendUvarint(b, 0)
	case strings.IndexByte(rawQuery, '&') < 0:
		b = binary.AppendUvarint(b, 1)
		b = appendField(b, rawQuery)
	default:
		pairs := strings.Split(rawQuery, "&")
		pairs = slices.DeleteFunc(pairs, func(p string) bool { return p == "" })
		slices.Sort(pairs)
		b = binary.AppendUvarint(b, uint64(len(pairs))) // the count keeps the query from spilling into later fields
		for _, p := range pairs {
			b = appendField(b, p)
		}
	}
	b = appendField(b, normalizeMediaType(contentType))
	if len(b)+len(body) <= cap(stack) { // small request: hash on the stack
		return hexSum(sha256.Sum256(append(b, body...)))
	}
	h := sha256.New()
	h.Write(b)
	h.Write(body)
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return hexSum(sum)
}

// ScopedKey returns the key a [Store] sees: the hex SHA-256 (64 characters) of
// the scope (principal, method, route template) and the idempotency key, so
// that the same key sent by two principals or to two endpoints names two
// records (IETF draft section 4, "Security Considerations"), and raw keys never
// reach the store or the logs.
func ScopedKey(principal, method, route, key string) string {
	var stack [512]byte
	b := appendField(stack[:0], principal)
	b = appendField(b, method)
	b = appendField(b, route)
	b = appendField(b, key)
	return hexSum(sha256.Sum256(b))
}

// appendField appends s length-prefixed, so that field boundaries can't be forged.
func appendField(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// hexSum returns sum in lower-case hex with one allocation.
func hexSum(sum [sha256.Size]byte) string {
	var dst [2 * sha256.Size]byte
	hex.Encode(dst[:], sum[:])
	return string(dst[:])
}

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
