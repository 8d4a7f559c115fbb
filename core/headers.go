package idem

import (
	"net/http"
	"slices"
	"unsafe"
)

// lineSource is a response's header lines as the handler left them: an
// http.Header (names sorted, so that an encoding is a function of the
// response) or a [HeaderLines] (names in the order of their first lines).
// Both reach the store through one filter ([Engine.eachStored]) and one
// encoder. Lines are passed to callbacks of concrete methods, not as an
// iter.Seq2: ranging over a func value the compiler cannot see moves the
// loop's state to the heap.
type lineSource struct {
	h     http.Header
	names []string // h's names, sorted
	l     *HeaderLines
}

// headerLines returns the lines of h; stack holds its sorted names when
// they fit.
func headerLines(h http.Header, stack *[16]string) lineSource {
	names := stack[:0]
	for k := range h {
		names = append(names, k)
	}
	slices.Sort(names)
	return lineSource{h: h, names: names}
}

// each calls fn for every line, lines of one name in a row; names and
// values are read-only.
func (ls *lineSource) each(fn func(k, v string)) {
	if ls.l == nil {
		for _, k := range ls.names {
			for _, v := range ls.h[k] {
				fn(k, v)
			}
		}
		return
	}
	l := ls.l
	for i := range l.count {
		k, _ := l.line(i)
		if l.seen(i, k) {
			continue
		}
		for j := i; j < l.count; j++ {
			if nk, v := l.line(j); string(nk) == string(k) {
				fn(view(nk), view(v))
			}
		}
	}
}

// eachStored calls fn for the lines of src worth replaying, first set on
// the first line of each name: lines the handler set (a name whose lines
// are exactly outer's belongs to the outer exchange), minus the unstored
// names ([WithUnstoredHeaders]), and only allowlisted ones under
// [WithStoredHeaders].
func (e *Engine) eachStored(src *lineSource, outer http.Header, fn func(k, v string, first bool)) {
	var stack [64]bool
	same := stack[:0] // per name of src, in order: its lines are outer's
	if len(outer) > 0 {
		same = sameAsOuter(src, outer, same)
	}
	run, prev, keep := -1, "", false
	src.each(func(k, v string) {
		first := run < 0 || k != prev
		if first {
			run++
			prev = k
			keep = e.storesName(k) && (run >= len(same) || !same[run])
		}
		if keep {
			fn(k, v, first)
		}
	})
}

// sameAsOuter appends to same, for each name of src in order, whether its
// lines are exactly outer's (same values, same order).
func sameAsOuter(src *lineSource, outer http.Header, same []bool) []bool {
	run, prev, n := -1, "", 0
	var ov []string
	src.each(func(k, v string) {
		if run < 0 || k != prev {
			if run >= 0 {
				same[run] = same[run] && n == len(ov)
			}
			run++
			prev, ov, n = k, outer[k], 0
			same = append(same, ov != nil)
		}
		if same[run] {
			same[run] = n < len(ov) && ov[n] == v
			n++
		}
	})
	if run >= 0 {
		same[run] = same[run] && n == len(ov)
	}
	return same
}

// encodeLines starts the encoding of the lines of src worth replaying
// (see eachStored), with room for extra body bytes after them.
func (e *Engine) encodeLines(src *lineSource, outer http.Header, extra int) encoder {
	size := 0
	e.eachStored(src, outer, func(k, v string, first bool) { size += lineSize(k, v, first) })
	w := newEncoder(size + extra)
	e.eachStored(src, outer, func(k, v string, _ bool) { w.line(k, v) })
	w.endLines()
	return w
}

// encode returns the encoding of a response with status, the lines of src
// worth replaying and body, in one new buffer.
func (e *Engine) encode(status int, src *lineSource, outer http.Header, body []byte) []byte {
	w := e.encodeLines(src, outer, len(body))
	w.b = append(w.b, body...)
	return w.encoding(status)
}

// encodeAll returns the encoding of r with all its lines (the engine's own
// answers, which no header policy applies to).
func encodeAll(r *Response) []byte {
	var stack [16]string
	src := headerLines(r.Header, &stack)
	size, prev := 0, ""
	src.each(func(k, v string) {
		size += lineSize(k, v, k != prev)
		prev = k
	})
	w := newEncoder(size + len(r.Body))
	src.each(w.line)
	w.endLines()
	w.b = append(w.b, r.Body...)
	return w.encoding(r.Status)
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

// view returns b as a string without copying; b must not change while the
// string is in use.
func view(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// seen reports whether a line before i is named k.
func (l *HeaderLines) seen(i int, k []byte) bool {
	for j := range i {
		if pk, _ := l.line(j); string(pk) == string(k) {
			return true
		}
	}
	return false
}
