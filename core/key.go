package idem

import (
	"errors"
	"strings"
)

// MaxKeyLength is the longest idempotency key accepted, in bytes (Stripe's limit).
const MaxKeyLength = 255

// Key parsing errors returned by [ParseKey]. The [Engine] answers each with 400.
var (
	ErrKeyMissing   = errors.New("idem: idempotency key header is missing")
	ErrKeyMalformed = errors.New("idem: idempotency key is malformed")
	ErrKeyTooLong   = errors.New("idem: idempotency key is longer than 255 characters")
	ErrKeyConflict  = errors.New("idem: idempotency key header sent more than once with different values")
)

// ParseKey returns the idempotency key carried by the values of every
// Idempotency-Key header line of a request.
//
// A value is either an RFC 8941 sf-string ("abc", with \" and \\ escapes), the
// form required by the IETF draft "The Idempotency-Key HTTP Header Field"
// section 2, or a bare token (abc), the form most clients send; both name the
// same key. A key is 1 to [MaxKeyLength] characters of visible ASCII
// (0x21–0x7E); bare tokens may not contain '"' or ','. Several lines, or a
// comma-separated list (how proxies merge repeated lines), are accepted only
// when every member names the same key.
//
// It returns [ErrKeyMissing] for no values, [ErrKeyTooLong],
// [ErrKeyConflict] for differing members, and [ErrKeyMalformed] for anything
// else (empty, control or non-ASCII bytes, parameters, unterminated quotes).
func ParseKey(values []string) (string, error) {
	if len(values) == 0 {
		return "", ErrKeyMissing
	}
	key := ""
	for _, v := range values {
		for {
			k, rest, err := parseMember(v)
			if err != nil {
				return "", err
			}
			if key == "" {
				key = k
			} else if k != key {
				return "", ErrKeyConflict
			}
			if rest == "" {
				break
			}
			v = rest
		}
	}
	return key, nil
}

// parseMember parses one list member of v and returns the text after its
// comma, or "" at the end of v.
func parseMember(v string) (key, rest string, err error) {
	v = strings.TrimLeft(v, " \t")
	if v == "" {
		return "", "", ErrKeyMalformed
	}
	var i int
	if v[0] == '"' {
		key, i, err = parseSFString(v)
		if err != nil {
			return "", "", err
		}
		if err := checkKey(key); err != nil {
			return "", "", err
		}
	} else {
		for i < len(v) && v[i] != ',' && v[i] != ' ' && v[i] != '\t' {
			if c := v[i]; c < 0x21 || c > 0x7e || c == '"' {
				return "", "", ErrKeyMalformed
			}
			i++
		}
		key = v[:i]
		if err := checkKeyLength(key); err != nil { // characters checked above
			return "", "", err
		}
	}
	tail := strings.TrimLeft(v[i:], " \t")
	if tail == "" {
		return key, "", nil
	}
	if tail[0] != ',' || len(tail) == 1 {
		return "", "", ErrKeyMalformed
	}
	return key, tail[1:], nil
}

// parseSFString parses the sf-string at the start of v (RFC 8941 section
// 4.2.5) and returns its content and the index after the closing quote.
func parseSFString(v string) (string, int, error) {
	var b []byte // only used when an escape is present
	escaped := false
	start := 1
	for i := 1; i < len(v); i++ {
		switch c := v[i]; {
		case c == '\\':
			if i+1 == len(v) || (v[i+1] != '"' && v[i+1] != '\\') {
				return "", 0, ErrKeyMalformed
			}
			b = append(b, v[start:i]...)
			escaped = true
			i++
			start = i
		case c == '"':
			if !escaped {
				return v[1:i], i + 1, nil
			}
			return string(append(b, v[start:i]...)), i + 1, nil
		case c < 0x20 || c > 0x7e:
			return "", 0, ErrKeyMalformed
		}
	}
	return "", 0, ErrKeyMalformed
}

// checkKeyLength refuses an empty key or one over [MaxKeyLength].
func checkKeyLength(k string) error {
	if k == "" {
		return ErrKeyMalformed
	}
	if len(k) > MaxKeyLength {
		return ErrKeyTooLong
	}
	return nil
}

func checkKey(k string) error {
	if err := checkKeyLength(k); err != nil {
		return err
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x21 || k[i] > 0x7e {
			return ErrKeyMalformed
		}
	}
	return nil
}
