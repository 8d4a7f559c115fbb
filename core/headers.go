package idem

import (
	"encoding/binary"
	"net/http"
	"slices"
	"unsafe"
)

// storedHeader returns the header lines worth replaying: those the handler
// set (lines of outer it left unchanged belong to the outer exchange), minus
// the unstored names, and only allowlisted ones under [WithStoredHeaders].
// The value slices are shared with h: the store copies what it keeps.
func (e *Engine) storedHeader(h, outer http.Header) http.Header {
	out := make(http.Header, len(h))
	for k, v := range h {
		if e.stores(k, v, outer) {
			out[k] = v
		}
	}
	return out
}

// keepStored is storedHeader deleting from h in place; it returns h, or
// an empty header when h is nil.
func (e *Engine) keepStored(h, outer http.Header) http.Header {
	if h == nil {
		return http.Header{}
	}
	for k, v := range h {
		if !e.stores(k, v, outer) {
			delete(h, k)
		}
	}
	return h
}

// stores reports whether the header line k: v is worth replaying (see storedHeader).
func (e *Engine) stores(k string, v []string, outer http.Header) bool {
	return len(v) > 0 && e.storesName(k) && !(slices.Equal(outer[k], v) && outer[k] != nil)
}

// storesName reports whether lines named k may be stored at all: not
// unstored ([WithUnstoredHeaders]) and allowlisted ([WithStoredHeaders]).
func (e *Engine) storesName(k string) bool {
	return !e.cfg.unstored[k] && (e.cfg.stored == nil || e.cfg.stored[k])
}

// HeaderLines collects the response header lines of a framework with its
// own header type, for [Execution.FinishLines], without allocating while
// they fit 1 KiB and 32 lines (past that it keeps them in an http.Header):
// declare one on the stack and Add every line. The zero value is ready.
type HeaderLines struct {
	buf   [1024]byte
	spans [32]lineSpan
	used  int // bytes of buf
	count int // spans
	more  http.Header
}

type lineSpan struct{ at, name, value uint16 } // offset in buf, lengths

// noLines is the HeaderLines of a FinishLines given none (read only).
var noLines HeaderLines

// Add appends the line name: value (both copied). The name is stored in
// its canonical form, as the key of an http.Header
// ([http.CanonicalHeaderKey]): frameworks that keep names as the handler
// set them (Fiber's DisableHeaderNormalizing) would otherwise escape the
// unstored names and the outer lines ([Execution.OuterHeader]), which are
// canonical.
func (l *HeaderLines) Add(name, value []byte) {
	if l.more == nil && l.count < len(l.spans) && l.used+len(name)+len(value) <= len(l.buf) {
		l.spans[l.count] = lineSpan{uint16(l.used), uint16(len(name)), uint16(len(value))}
		n := copy(l.buf[l.used:], name)
		canonicalKey(l.buf[l.used : l.used+n])
		l.used += n
		l.used += copy(l.buf[l.used:], value)
		l.count++
		return
	}
	if l.more == nil {
		l.more = make(http.Header, l.count+1)
		for i := range l.count {
			k, v := l.line(i)
			l.more[string(k)] = append(l.more[string(k)], string(v))
		}
	}
	k := http.CanonicalHeaderKey(string(name))
	l.more[k] = append(l.more[k], string(value))
}

// canonicalKey rewrites k in place as [http.CanonicalHeaderKey] would
// return it: unchanged unless it is a token, else upper case first and
// after each hyphen, lower case elsewhere.
func canonicalKey(k []byte) {
	if !isToken(unsafe.String(unsafe.SliceData(k), len(k))) {
		return
	}
	upper := true
	for i, c := range k {
		switch {
		case upper && 'a' <= c && c <= 'z':
			c -= 'a' - 'A'
		case !upper && 'A' <= c && c <= 'Z':
			c += 'a' - 'A'
		}
		k[i] = c
		upper = c == '-'
	}
}

func (l *HeaderLines) line(i int) (name, value []byte) {
	sp := l.spans[i]
	name = l.buf[sp.at : sp.at+sp.name]
	return name, l.buf[sp.at+sp.name : sp.at+sp.name+sp.value]
}

// location returns the first Location line's value, or "".
func (l *HeaderLines) location() string {
	for i := range l.count {
		if k, v := l.line(i); string(k) == "Location" {
			return string(v)
		}
	}
	return ""
}

// encodeLines returns the Response holding the lines worth replaying (see
// storedHeader) and body in their stored encoding, in one new buffer; w
// receives its header.
func (e *Engine) encodeLines(l *HeaderLines, status int, body []byte, outer http.Header, w *wire) Response {
	var keep [32]bool // the first line of each stored name
	size, names := 1+2*binary.MaxVarintLen64+len(body), 0
	for i := range l.count {
		k, _ := l.line(i)
		if l.seen(i, k) || !e.storesLines(l, i, k, outer) {
			continue
		}
		keep[i] = true
		names++
		size += 2*binary.MaxVarintLen64 + len(k)
		for j := i; j < l.count; j++ {
			if nk, v := l.line(j); string(nk) == string(k) {
				size += binary.MaxVarintLen64 + len(v)
			}
		}
	}
	b := make([]byte, 0, size)
	b = append(b, codecVersion)
	b = binary.AppendUvarint(b, uint64(status))
	b = binary.AppendUvarint(b, uint64(names))
	start := len(b)
	for i := range l.count {
		if !keep[i] {
			continue
		}
		k, _ := l.line(i)
		n := 0
		for j := i; j < l.count; j++ {
			if nk, _ := l.line(j); string(nk) == string(k) {
				n++
			}
		}
		b = append(binary.AppendUvarint(b, uint64(len(k))), k...)
		b = binary.AppendUvarint(b, uint64(n))
		for j := i; j < l.count; j++ {
			if nk, v := l.line(j); string(nk) == string(k) {
				b = append(binary.AppendUvarint(b, uint64(len(v))), v...)
			}
		}
	}
	end := len(b)
	b = append(b, body...)
	*w = wire{lines: unsafe.String(unsafe.SliceData(b[start:]), end-start), names: int32(names)}
	return Response{Status: status, Body: b[end:len(b):len(b)], wire: w}
}

// seen reports whether a line before i is named k.
func (l *HeaderLines) seen(i int, k []byte) bool {
	for j := range i {
		if pk, _ := l.line(j); string(pk) == string(k) {
			return true
		}
	}
	return false
}

// storesLines is [Engine.stores] for the lines named k, the first at i.
func (e *Engine) storesLines(l *HeaderLines, i int, k []byte, outer http.Header) bool {
	if !e.storesName(unsafe.String(unsafe.SliceData(k), len(k))) { // k is only read
		return false
	}
	ov := outer[string(k)]
	if ov == nil {
		return true
	}
	n := 0
	for j := i; j < l.count; j++ {
		if nk, v := l.line(j); string(nk) == string(k) {
			if n >= len(ov) || ov[n] != string(v) {
				return true // the handler changed it
			}
			n++
		}
	}
	return n != len(ov)
}
