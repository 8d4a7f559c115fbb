package idem

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
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
	h := sha256.New()
	writeField(h, method)
	writeField(h, path)
	if strings.IndexByte(rawQuery, '&') < 0 {
		writeField(h, rawQuery)
	} else {
		pairs := strings.Split(rawQuery, "&")
		slices.Sort(pairs)
		for _, p := range pairs {
			if p != "" {
				writeField(h, p)
			}
		}
	}
	writeField(h, normalizeMediaType(contentType))
	h.Write(body)
	return hex.EncodeToString(h.Sum(make([]byte, 0, sha256.Size)))
}

// ScopedKey returns the key a [Store] sees: the hex SHA-256 (64 characters) of
// the scope (principal, method, route template) and the idempotency key, so
// that the same key sent by two principals or to two endpoints names two
// records (IETF draft section 4, "Security Considerations"), and raw keys never
// reach the store or the logs.
func ScopedKey(principal, method, route, key string) string {
	h := sha256.New()
	writeField(h, principal)
	writeField(h, method)
	writeField(h, route)
	writeField(h, key)
	return hex.EncodeToString(h.Sum(make([]byte, 0, sha256.Size)))
}

// writeField writes s length-prefixed, so that field boundaries can't be forged.
func writeField(h hash.Hash, s string) {
	var n [binary.MaxVarintLen64]byte
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
	h.Write([]byte(s))
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
