package idem

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// JSONFingerprint compares JSON bodies (RFC 8259) by value: the order of
// object members and insignificant whitespace don't matter; strings are
// compared decoded ("\u00e9" is "é"; invalid UTF-8 reads as U+FFFD, as
// encoding/json reads it); numbers are compared as written (1.0 is not 1);
// array order matters. Bodies that are not one valid JSON value, repeat a
// member name within an object or nest deeper than 1000 levels are compared
// byte for byte. The media type counts as with [BytesFingerprint]. ID
// "json".
func JSONFingerprint() Fingerprinter { return newJSONFingerprint("json", nil, nil) }

// JSONFingerprintExcluding is [JSONFingerprint] with the members at the
// given JSON Pointers (RFC 6901: "/sent_at", "/items/0/note", "~1" for a
// "/" in a name, "~0" for a "~") left out, so a client may change them
// between retries (timestamps, trace ids). An excluded array element
// still counts as present. ID "json-x" and 8 hex characters naming the
// pointer set; [New] returns an error for a pointer that is not RFC 6901
// or is "" (the whole body).
func JSONFingerprintExcluding(pointers ...string) Fingerprinter {
	return newJSONFingerprint("json-x", pointers, nil)
}

// JSONFingerprintOnly is [JSONFingerprint] over only the values at the
// given JSON Pointers (RFC 6901), each compared whole; everything else in
// the body may change between retries. A pointer that names nothing
// counts as absent, which differs from any value, null included. ID
// "json-o" and 8 hex characters naming the pointer set; [New] returns an
// error for a pointer that is not RFC 6901.
func JSONFingerprintOnly(pointers ...string) Fingerprinter {
	return newJSONFingerprint("json-o", nil, pointers)
}

// jsonCanon is the configuration of a JSON fingerprint.
type jsonCanon struct {
	exclude, only map[string]bool // pointers, as written (escaped)
	prefixes      map[string]bool // proper prefixes of the pointers, "" included
}

func newJSONFingerprint(id string, exclude, only []string) Fingerprinter {
	c := &jsonCanon{prefixes: map[string]bool{}}
	set := func(ps []string) (map[string]bool, error) {
		m := make(map[string]bool, len(ps))
		for _, p := range ps {
			if err := checkPointer(p); err != nil {
				return nil, err
			}
			m[p] = true
			for i := 0; i < len(p); i++ {
				if p[i] == '/' {
					c.prefixes[p[:i]] = true
				}
			}
		}
		return m, nil
	}
	var err error
	if exclude != nil {
		c.exclude, err = set(exclude)
		if err == nil && c.exclude[""] {
			err = errors.New(`idem: JSONFingerprintExcluding(""): excluding the whole body leaves nothing to compare`)
		}
	}
	if only != nil && err == nil {
		c.only, err = set(only)
		if c.only[""] { // the whole body: plain JSON
			c.only, c.prefixes = nil, nil
		}
	}
	if exclude != nil || only != nil {
		ps := slices.Sorted(func(yield func(string) bool) {
			for p := range c.exclude {
				if !yield(p) {
					return
				}
			}
			for p := range c.only {
				if !yield(p) {
					return
				}
			}
		})
		h := sha256.New()
		for _, p := range ps {
			h.Write(appendField(nil, p))
		}
		id += fmt.Sprintf("%x", h.Sum(nil)[:4])
	}
	return Fingerprinter{id: id, canon: c.append, err: err}
}

// checkPointer reports whether p is an RFC 6901 JSON Pointer.
func checkPointer(p string) error {
	if p != "" && p[0] != '/' {
		return fmt.Errorf("idem: JSON Pointer %q must be empty or start with '/' (RFC 6901)", p)
	}
	for i := 0; i < len(p); i++ {
		if p[i] == '~' && (i+1 == len(p) || p[i+1] != '0' && p[i+1] != '1') {
			return fmt.Errorf("idem: JSON Pointer %q: '~' must be followed by 0 or 1 (RFC 6901)", p)
		}
	}
	return nil
}

// maxJSONDepth bounds the nesting the canonical form follows; deeper
// bodies are compared byte for byte.
const maxJSONDepth = 1000

// errJSON is the cause of every body the canonical form does not read.
var errJSON = fmt.Errorf("%w: not a JSON value it reads", ErrNotCanonical)

// jsonSeg is a span of the canonical form: an object member or a selected
// value, sorted by its name (key) before the span is final.
type jsonSeg struct{ start, end, keyStart, keyEnd int }

// jsonWalk is one canonicalisation: a recursive descent over src writing
// the canonical form, a self-delimiting encoding (never JSON again):
// 's' string, 'n' number (as written), 't', 'f', 'z' (null), '{' (':' name
// value)* '}' with members sorted by name, '[' value* ']', 'x' an excluded
// array element; under JSONFingerprintOnly, 'p' (pointer value)* sorted by
// pointer. Names, strings and numbers are length-prefixed.
type jsonWalk struct {
	*jsonCanon
	src     []byte
	i       int
	depth   int
	segs    []jsonSeg // members of the objects open, innermost last
	picked  []jsonSeg // JSONFingerprintOnly: the selected values
	path    []byte    // pointer of the current value, when tracked
	str     []byte    // a decoded string
	scratch []byte    // reordering
}

// walkPool holds jsonWalks and their buffers between requests.
var walkPool = sync.Pool{New: func() any { return new(jsonWalk) }}

func (c *jsonCanon) append(dst []byte, contentType string, body []byte) ([]byte, error) {
	w := walkPool.Get().(*jsonWalk)
	*w = jsonWalk{jsonCanon: c, src: body, segs: w.segs[:0], picked: w.picked[:0], path: w.path[:0], str: w.str[:0], scratch: w.scratch[:0]}
	defer func() {
		w.jsonCanon, w.src = nil, nil
		if cap(w.scratch) <= 4<<20 {
			walkPool.Put(w)
		}
	}()
	dst = appendField(dst, normalizeMediaType(contentType))
	var err error
	if c.only != nil {
		dst = append(dst, 'p')
		from := len(dst)
		if dst, err = w.search(dst); err != nil {
			return dst, err
		}
		if dst, err = w.reorder(dst, from, w.picked); err != nil {
			return dst, err
		}
	} else if dst, err = w.value(dst, c.exclude != nil); err != nil {
		return dst, err
	}
	if w.skipSpace(); w.i != len(w.src) {
		return dst, errJSON
	}
	return dst, nil
}

func (w *jsonWalk) skipSpace() {
	if w.i < len(w.src) && w.src[w.i] > ' ' { // compact JSON: no space here
		return
	}
	for w.i < len(w.src) {
		switch w.src[w.i] {
		case ' ', '\t', '\n', '\r':
			w.i++
		default:
			return
		}
	}
}

// value appends the canonical form of the value at w.i. track says that
// w.path holds its pointer and some excluded pointer lies below it.
func (w *jsonWalk) value(dst []byte, track bool) ([]byte, error) {
	w.skipSpace()
	if w.i == len(w.src) {
		return dst, errJSON
	}
	switch c := w.src[w.i]; {
	case c == '{':
		return w.object(dst, track)
	case c == '[':
		return w.array(dst, track)
	case c == '"':
		s, err := w.string()
		if err != nil {
			return dst, err
		}
		return appendFieldBytes(append(dst, 's'), s), nil
	case c == '-' || '0' <= c && c <= '9':
		n, err := w.number()
		if err != nil {
			return dst, err
		}
		return appendFieldBytes(append(dst, 'n'), n), nil
	}
	for _, lit := range jsonLiterals {
		if bytes.HasPrefix(w.src[w.i:], lit.text) {
			w.i += len(lit.text)
			return append(dst, lit.tag), nil
		}
	}
	return dst, errJSON
}

func (w *jsonWalk) enter() error {
	if w.depth++; w.depth > maxJSONDepth {
		return errJSON
	}
	w.i++ // '{' or '['
	return nil
}

// object appends an object, its members sorted by name.
func (w *jsonWalk) object(dst []byte, track bool) ([]byte, error) {
	if err := w.enter(); err != nil {
		return dst, err
	}
	dst = append(dst, '{')
	from, base := len(dst), len(w.segs)
	pathLen := len(w.path)
	for first := true; ; first = false {
		w.skipSpace()
		if w.i < len(w.src) && w.src[w.i] == '}' && first {
			break
		}
		if w.i == len(w.src) || w.src[w.i] != '"' {
			return dst, errJSON
		}
		name, err := w.string()
		if err != nil {
			return dst, err
		}
		if w.skipSpace(); w.i == len(w.src) || w.src[w.i] != ':' {
			return dst, errJSON
		}
		w.i++
		start := len(dst)
		dst = appendFieldBytes(append(dst, ':'), name)
		keyEnd := len(dst)
		keyStart := keyEnd - len(name)
		childTrack := false
		if track {
			w.path = appendPointerToken(append(w.path[:pathLen], '/'), name)
			if w.exclude[string(w.path)] {
				if _, err := w.value(dst, false); err != nil { // read and drop
					return dst, err
				}
				dst = dst[:start]
				goto next
			}
			childTrack = w.prefixes[string(w.path)]
		}
		if dst, err = w.value(dst, childTrack); err != nil {
			return dst, err
		}
		w.segs = append(w.segs, jsonSeg{start, len(dst), keyStart, keyEnd})
	next:
		if w.skipSpace(); w.i < len(w.src) && w.src[w.i] == ',' {
			w.i++
			continue
		}
		if w.i < len(w.src) && w.src[w.i] == '}' {
			break
		}
		return dst, errJSON
	}
	w.i++
	w.depth--
	w.path = w.path[:pathLen]
	dst, err := w.reorder(dst, from, w.segs[base:])
	w.segs = w.segs[:base]
	return append(dst, '}'), err
}

// array appends an array; an excluded element is an 'x'.
func (w *jsonWalk) array(dst []byte, track bool) ([]byte, error) {
	if err := w.enter(); err != nil {
		return dst, err
	}
	dst = append(dst, '[')
	pathLen := len(w.path)
	for n := 0; ; n++ {
		w.skipSpace()
		if w.i < len(w.src) && w.src[w.i] == ']' && n == 0 {
			break
		}
		childTrack := false
		var err error
		if track {
			w.path = strconv.AppendInt(append(w.path[:pathLen], '/'), int64(n), 10)
			if w.exclude[string(w.path)] {
				start := len(dst)
				if _, err := w.value(dst, false); err != nil {
					return dst, err
				}
				dst = append(dst[:start], 'x')
				goto next
			}
			childTrack = w.prefixes[string(w.path)]
		}
		if dst, err = w.value(dst, childTrack); err != nil {
			return dst, err
		}
	next:
		if w.skipSpace(); w.i < len(w.src) && w.src[w.i] == ',' {
			w.i++
			continue
		}
		if w.i < len(w.src) && w.src[w.i] == ']' {
			break
		}
		return dst, errJSON
	}
	w.i++
	w.depth--
	w.path = w.path[:pathLen]
	return append(dst, ']'), nil
}

// search reads the value at w.i, whose pointer is w.path, appending only
// the selected values below it ('p' entries: pointer, value) and noting
// them in w.picked.
func (w *jsonWalk) search(dst []byte) ([]byte, error) {
	w.skipSpace()
	if w.i == len(w.src) {
		return dst, errJSON
	}
	if c := w.src[w.i]; c != '{' && c != '[' {
		start := len(dst)
		dst, err := w.value(dst, false) // validate, then drop
		return dst[:start], err
	}
	isObject := w.src[w.i] == '{'
	closing := byte(']')
	if isObject {
		closing = '}'
	}
	if err := w.enter(); err != nil {
		return dst, err
	}
	pathLen := len(w.path)
	for n := 0; ; n++ {
		w.skipSpace()
		if w.i < len(w.src) && w.src[w.i] == closing && n == 0 {
			break
		}
		w.path = append(w.path[:pathLen], '/')
		if isObject {
			if w.i == len(w.src) || w.src[w.i] != '"' {
				return dst, errJSON
			}
			name, err := w.string()
			if err != nil {
				return dst, err
			}
			if w.skipSpace(); w.i == len(w.src) || w.src[w.i] != ':' {
				return dst, errJSON
			}
			w.i++
			w.path = appendPointerToken(w.path, name)
		} else {
			w.path = strconv.AppendInt(w.path, int64(n), 10)
		}
		var err error
		switch {
		case w.only[string(w.path)]:
			start := len(dst)
			dst = appendFieldBytes(dst, w.path)
			keyEnd := len(dst)
			if dst, err = w.value(dst, false); err != nil {
				return dst, err
			}
			w.picked = append(w.picked, jsonSeg{start, len(dst), keyEnd - (len(w.path)), keyEnd})
		case w.prefixes[string(w.path)]:
			dst, err = w.search(dst)
		default:
			start := len(dst)
			dst, err = w.value(dst, false)
			dst = dst[:start]
		}
		if err != nil {
			return dst, err
		}
		if w.skipSpace(); w.i < len(w.src) && w.src[w.i] == ',' {
			w.i++
			continue
		}
		if w.i < len(w.src) && w.src[w.i] == closing {
			break
		}
		return dst, errJSON
	}
	w.i++
	w.depth--
	w.path = w.path[:pathLen]
	return dst, nil
}

// reorder sorts the spans segs of dst[from:] (which they cover, in order)
// by name and rewrites them so; a name twice is an error (RFC 8259
// section 4: names SHOULD be unique; readers disagree on duplicates).
func (w *jsonWalk) reorder(dst []byte, from int, segs []jsonSeg) ([]byte, error) {
	if len(segs) < 2 {
		return dst, nil
	}
	name := func(s jsonSeg) []byte { return dst[s.keyStart:s.keyEnd] }
	if len(segs) <= 12 { // objects are mostly small: insertion sort, no indirection
		for i := 1; i < len(segs); i++ {
			for j := i; j > 0 && bytes.Compare(dst[segs[j].keyStart:segs[j].keyEnd], dst[segs[j-1].keyStart:segs[j-1].keyEnd]) < 0; j-- {
				segs[j], segs[j-1] = segs[j-1], segs[j]
			}
		}
	} else {
		slices.SortFunc(segs, func(x, y jsonSeg) int { return bytes.Compare(name(x), name(y)) })
	}
	sorted := true
	for i := 1; i < len(segs); i++ {
		if bytes.Equal(name(segs[i-1]), name(segs[i])) {
			return dst, fmt.Errorf("%w: member %q repeated", errJSON, name(segs[i]))
		}
		sorted = sorted && segs[i-1].end == segs[i].start
	}
	if sorted && segs[0].start == from {
		return dst, nil
	}
	w.scratch = append(w.scratch[:0], dst[from:]...)
	out := dst[:from]
	for _, s := range segs {
		out = append(out, w.scratch[s.start-from:s.end-from]...)
	}
	return out, nil
}

// appendPointerToken appends name escaped as an RFC 6901 reference token.
func appendPointerToken(b, name []byte) []byte {
	if bytes.IndexByte(name, '~') < 0 && bytes.IndexByte(name, '/') < 0 {
		return append(b, name...)
	}
	for i := 0; i < len(name); i++ {
		switch name[i] {
		case '~':
			b = append(b, '~', '0')
		case '/':
			b = append(b, '~', '1')
		default:
			b = append(b, name[i])
		}
	}
	return b
}

// number reads a JSON number (RFC 8259 section 6) and returns it as written.
func (w *jsonWalk) number() ([]byte, error) {
	s, i := w.src, w.i
	digits := func() bool {
		n := i
		for i < len(s) && '0' <= s[i] && s[i] <= '9' {
			i++
		}
		return i > n
	}
	if s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case !digits():
		return nil, errJSON
	}
	if i < len(s) && s[i] == '.' {
		if i++; !digits() {
			return nil, errJSON
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		if i++; i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if !digits() {
			return nil, errJSON
		}
	}
	n := s[w.i:i]
	w.i = i
	return n, nil
}

// string reads a JSON string and returns it decoded as encoding/json
// decodes it. The result aliases src or w.str; use it before the next call.
func (w *jsonWalk) string() ([]byte, error) {
	s := w.src
	i := w.i + 1
	for i < len(s) && plainStringByte[s[i]] { // fast path: no escapes, ASCII
		i++
	}
	if i < len(s) && s[i] == '"' {
		out := s[w.i+1 : i]
		w.i = i + 1
		return out, nil
	}
	b := append(w.str[:0], s[w.i+1:i]...)
	for i < len(s) {
		switch c := s[i]; {
		case c == '"':
			w.str = b
			w.i = i + 1
			return b, nil
		case c < 0x20:
			return nil, errJSON
		case c == '\\':
			if i+1 == len(s) {
				return nil, errJSON
			}
			switch e := s[i+1]; e {
			case '"', '\\', '/':
				b = append(b, e)
			case 'b':
				b = append(b, '\b')
			case 'f':
				b = append(b, '\f')
			case 'n':
				b = append(b, '\n')
			case 'r':
				b = append(b, '\r')
			case 't':
				b = append(b, '\t')
			case 'u':
				r := getu4(s[i:])
				if r < 0 {
					return nil, errJSON
				}
				i += 6
				if utf16.IsSurrogate(r) {
					if dec := utf16.DecodeRune(r, getu4(s[i:])); dec != unicode.ReplacementChar {
						i += 6
						b = utf8.AppendRune(b, dec)
						continue
					}
					r = unicode.ReplacementChar
				}
				b = utf8.AppendRune(b, r)
				continue
			default:
				return nil, errJSON
			}
			i += 2
		case c < utf8.RuneSelf:
			b = append(b, c)
			i++
		default:
			r, size := utf8.DecodeRune(s[i:])
			b = utf8.AppendRune(b, r) // an invalid byte reads as U+FFFD
			i += size
		}
	}
	return nil, errJSON
}

// plainStringByte tells the bytes a JSON string holds as they are: ASCII
// from 0x20, except '"' and '\\'.
var plainStringByte = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

var jsonLiterals = [...]struct {
	text []byte
	tag  byte
}{{[]byte("true"), 't'}, {[]byte("false"), 'f'}, {[]byte("null"), 'z'}}

// appendFieldBytes is appendField for bytes.
func appendFieldBytes(b, s []byte) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// getu4 decodes \uXXXX at the start of s, or returns -1.
func getu4(s []byte) rune {
	if len(s) < 6 || s[0] != '\\' || s[1] != 'u' {
		return -1
	}
	var r rune
	for _, c := range s[2:6] {
		if !isHex(c) {
			return -1
		}
		r = r<<4 | rune(unhex(c))
	}
	return r
}
