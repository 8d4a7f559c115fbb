package idemclient

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/google/uuid"

	idem "github.com/idemkit/idem/core"
)

// keyNamespace is the RFC 9562 name space of the keys [Key] derives (a
// random UUID fixed for idemclient).
var keyNamespace = uuid.MustParse("5c0e7d3a-5f0b-4b9e-9d3c-6e1f1a2b7c41")

// Key derives a deterministic idempotency key from the caller's own durable
// identifiers (user id, order id, attempt of the business operation, ...),
// so that a process that crashes and restarts sends the same key again and
// gets the stored answer instead of a second execution.
//
// The key is a name-based UUID version 8 over SHA-256 (RFC 9562 section 5.8
// and appendix B.2) of the parts, each prefixed by its length, so that
// Key("ab", "c") and Key("a", "bc") differ. It is 36 characters of visible
// ASCII and passes idem.ParseKey (and length-36 checks such as Fiber's
// idempotency middleware). Equal parts always give the same key, in every
// process and every version of this package.
func Key(parts ...string) string {
	var name []byte
	for _, p := range parts {
		name = binary.AppendUvarint(name, uint64(len(p)))
		name = append(name, p...)
	}
	return uuid.NewHash(sha256.New(), keyNamespace, name, 8).String()
}

// newKey returns a random key for a request that has none: a UUID version 7
// (RFC 9562 section 5.7: 74 random bits from crypto/rand after a
// millisecond timestamp, so that keys sort by creation in B-tree stores).
func newKey() (string, error) {
	u, err := uuid.NewV7()
	if err != nil {
		return "", fmt.Errorf("idemclient: generating an idempotency key: %w", err)
	}
	return u.String(), nil
}

type keyContextKey struct{}

// WithKey returns a context that makes the [Transport] send key as the
// idempotency key of requests made with it, whatever their method, instead
// of a random one. A key the request's header already carries wins over it.
// The key must pass idem.ParseKey (1 to 255 visible ASCII characters, no '"'
// or ','); RoundTrip returns an error wrapping idem.ErrKeyMalformed or
// idem.ErrKeyTooLong otherwise, without sending anything.
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyContextKey{}, key)
}

// checkKey validates a caller's key with the server's own parser.
func checkKey(key string) error {
	if _, err := idem.ParseKey([]string{key}); err != nil {
		return fmt.Errorf("idemclient: idempotency key %q: %w", key, err)
	}
	return nil
}
