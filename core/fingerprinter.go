package idem

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"slices"
	"strings"
	"sync"
)

// Fingerprinter is a fingerprint function: it decides which requests count
// as the same request under one idempotency key. Every fingerprint covers
// the method, path and query ([Fingerprint]'s rules); a Fingerprinter
// decides how the media type and body count. The zero value is the
// default, [BytesFingerprint].
//
// Fingerprints of every Fingerprinter but the default are stored as
// "ID:" followed by 64 hex characters, so that an engine comparing a
// stored fingerprint with a new one tells "same function, other request"
// (422 "key-reused") from "another function" (422 "fingerprint-changed",
// or a fresh comparison when the engine knows that function: see
// [WithKnownFingerprints]). Default fingerprints stay 64 hex characters.
type Fingerprinter struct {
	id string
	// canon appends the canonical form of the media type and body to dst;
	// an error makes the engine compare them byte for byte instead.
	canon func(dst []byte, contentType string, body []byte) ([]byte, error)
	err   error // a construction error, returned by New
}

// ErrNotCanonical is returned (wrapped) by a canonical form function when
// the body is not in the form it reads (not JSON, not multipart); the
// request is then fingerprinted byte for byte under the same function.
var ErrNotCanonical = errors.New("idem: body not in the fingerprint's canonical form")

// BytesFingerprint is the default fingerprint function: the media type
// (lower-cased, spaces removed, parameters kept) and the raw body bytes,
// exactly ([Fingerprint]). Its fingerprints carry no ID.
func BytesFingerprint() Fingerprinter { return Fingerprinter{} }

// NewFingerprinter returns a fingerprint function named id, whose canonical
// form of a request's Content-Type value and body is what canon appends to
// dst: two requests with equal method, path, query and canonical form are
// the same request. canon must be deterministic and safe for concurrent
// use, and must not keep dst or body. When it returns an error the request
// is compared byte for byte (as [BytesFingerprint], under id).
//
// id names the function in stored fingerprints: 1 to 32 characters of
// a-z, 0-9, '.', '_' and '-'. Give it a new id whenever canon changes what
// it considers equal, so that records stored under the old one answer
// "fingerprint-changed" rather than a wrong replay or mismatch. [New]
// returns an error for an invalid id or a nil canon.
func NewFingerprinter(id string, canon func(dst []byte, contentType string, body []byte) ([]byte, error)) Fingerprinter {
	f := Fingerprinter{id: id, canon: canon}
	if !validFingerprintID(id) {
		f.err = fmt.Errorf("idem: fingerprint id %q: want 1 to 32 characters of a-z 0-9 . _ -", id)
	} else if canon == nil {
		f.err = fmt.Errorf("idem: fingerprint %q: nil canonical form function", id)
	}
	return f
}

// ID returns the name stored in front of the function's fingerprints, ""
// for [BytesFingerprint].
func (f Fingerprinter) ID() string { return f.id }

// Fingerprint returns the fingerprint f gives a request, as the engine
// stores it: [Fingerprint] for [BytesFingerprint], else "ID:" and 64 hex
// characters.
func (f Fingerprinter) Fingerprint(method, path, rawQuery, contentType string, body []byte) string {
	if f.id == "" {
		return Fingerprint(method, path, rawQuery, contentType, body)
	}
	return string(f.appendFingerprint(nil, method, path, rawQuery, contentType, body))
}

// canonPool holds buffers for canonical forms (a request body at most).
var canonPool = sync.Pool{New: func() any { return new([]byte) }}

// appendFingerprint appends f's stored fingerprint of the request to b:
// the bare hex SHA-256 for the default, else ID ":" hex. Canonical forms
// are hashed with a 'c' in front, byte-exact fallbacks with an 'r', so the
// two never collide.
func (f *Fingerprinter) appendFingerprint(b []byte, method, path, rawQuery, contentType string, body []byte) []byte {
	if f.id == "" {
		return appendHex(b, fingerprintSum(method, path, rawQuery, contentType, body))
	}
	bp := canonPool.Get().(*[]byte)
	c := appendField((*bp)[:0], method)
	c = appendField(c, path)
	c = appendQuery(c, rawQuery)
	n := len(c)
	err := ErrNotCanonical // a function New would refuse reads nothing
	if f.canon != nil {
		c, err = f.canon(append(c, 'c'), contentType, body)
	}
	if err != nil {
		c = appendField(append(c[:n], 'r'), normalizeMediaType(contentType))
		c = append(c, body...)
	}
	sum := sha256.Sum256(c)
	if cap(c) <= 4<<20 { // don't keep what an unusual canonical form grew
		*bp = c
		canonPool.Put(bp)
	}
	b = append(append(b, f.id...), ':')
	return appendHex(b, sum)
}

// fingerprintID returns the ID in front of a stored fingerprint, "" for
// a default one (no ':').
func fingerprintID(fp string) string {
	if i := strings.IndexByte(fp, ':'); i >= 0 {
		return fp[:i]
	}
	return ""
}

func validFingerprintID(id string) bool {
	if id == "" || len(id) > 32 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// FormFingerprint compares application/x-www-form-urlencoded bodies by
// their parsed values, with the query's rules ([Fingerprint]): the order of
// distinct names, "+" or "%20", and percent-encoding don't matter; the
// order of one name's values and every decoded byte do. Other media types
// and bodies [url.ParseQuery] rejects are compared byte for byte. ID "form".
func FormFingerprint() Fingerprinter {
	return Fingerprinter{id: "form", canon: func(dst []byte, contentType string, body []byte) ([]byte, error) {
		mt, _, _ := strings.Cut(normalizeMediaType(contentType), ";")
		if mt != "application/x-www-form-urlencoded" {
			return dst, ErrNotCanonical
		}
		dst = appendField(dst, normalizeMediaType(contentType))
		// appendQuery marks an unparsable body itself and appends it raw.
		return appendQuery(dst, string(body)), nil
	}}
}

// MultipartFingerprint compares multipart/form-data bodies (RFC 7578) part
// by part: each part's field name, file name and the SHA-256 of its content
// (decoded as mime/multipart decodes it). The boundary, which clients pick
// at random per body, and the parts' other headers don't count; parts of
// distinct names may come in any order, parts of one name in theirs. Other
// media types and bodies mime/multipart cannot read are compared byte for
// byte. ID "multipart".
func MultipartFingerprint() Fingerprinter {
	return Fingerprinter{id: "multipart", canon: appendMultipart}
}

// multipartPart is one part of a multipart body, as fingerprinted.
type multipartPart struct {
	name, filename string
	sum            [sha256.Size]byte
}

func appendMultipart(dst []byte, contentType string, body []byte) ([]byte, error) {
	mt, params, err := mime.ParseMediaType(contentType)
	if err != nil || mt != "multipart/form-data" || params["boundary"] == "" {
		return dst, ErrNotCanonical
	}
	r := multipart.NewReader(bytes.NewReader(body), params["boundary"])
	var parts []multipartPart
	h := sha256.New()
	buf := make([]byte, 4<<10) // io.Copy would take 32 KiB per part
	for {
		p, err := r.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			return dst, fmt.Errorf("%w: %w", ErrNotCanonical, err)
		}
		h.Reset()
		if _, err := io.CopyBuffer(h, p, buf); err != nil {
			return dst, fmt.Errorf("%w: %w", ErrNotCanonical, err)
		}
		mp := multipartPart{name: p.FormName(), filename: p.FileName()}
		h.Sum(mp.sum[:0])
		parts = append(parts, mp)
	}
	slices.SortStableFunc(parts, func(x, y multipartPart) int { return strings.Compare(x.name, y.name) })
	dst = appendField(dst, mt)
	dst = binary.AppendUvarint(dst, uint64(len(parts)))
	for _, p := range parts {
		dst = appendField(dst, p.name)
		dst = appendField(dst, p.filename)
		dst = append(dst, p.sum[:]...)
	}
	return dst, nil
}

// WithFingerprint sets the fingerprint function of every route (those given
// [RouteFingerprint] aside): [JSONFingerprint],
// [JSONFingerprintExcluding], [JSONFingerprintOnly], [MultipartFingerprint],
// [FormFingerprint] or one of [NewFingerprinter]. Optional. Default is
// [BytesFingerprint] (byte-exact, IETF draft section 2.7).
//
// Changing it changes how stored records are compared; see
// [WithKnownFingerprints] for a rolling deploy.
func WithFingerprint(f Fingerprinter) Option { return func(c *config) { c.fingerprint = f } }

// WithKnownFingerprints names fingerprint functions this engine does not
// use for new records but recognises in stored ones: a request whose key
// holds a record fingerprinted by one of them (or by [BytesFingerprint],
// always known, or by any function set with [WithFingerprint] or
// [RouteFingerprint]) is fingerprinted again with that function and
// compared, so it replays (or gets 409) when that function finds it the
// same request, and 422 "key-reused" otherwise. A record made by a
// function the engine does not know is answered 422
// "fingerprint-changed". Use it to roll a fingerprint change out without
// 422s: first deploy the new function here, then make it the
// [WithFingerprint] one. Optional. Default is none.
func WithKnownFingerprints(fs ...Fingerprinter) Option {
	return func(c *config) { c.knownFingerprints = append(c.knownFingerprints, fs...) }
}

// indexFingerprints checks the configured fingerprint functions and indexes
// them by ID.
func (c *config) indexFingerprints() error {
	c.fingerprints = map[string]Fingerprinter{"": {}}
	add := func(f Fingerprinter) error {
		if f.err != nil {
			return f.err
		}
		c.fingerprints[f.id] = f
		return nil
	}
	if err := add(c.fingerprint); err != nil {
		return err
	}
	for _, p := range c.routes {
		if err := add(p.fingerprint); err != nil {
			return err
		}
	}
	for _, f := range c.knownFingerprints {
		if err := add(f); err != nil {
			return err
		}
	}
	return nil
}

// sameRequest reports whether req, whose fingerprint fp differs from the
// stored one, is the stored request after all: stored was made by another
// function this engine knows, and that function gives req the same
// fingerprint.
func (e *Engine) sameRequest(req *Request, stored, fp string) bool {
	id := fingerprintID(stored)
	if id == fingerprintID(fp) {
		return false
	}
	f, ok := e.cfg.fingerprints[id]
	return ok && f.Fingerprint(req.Method, req.Path, req.RawQuery, req.ContentType, req.Body) == stored
}
