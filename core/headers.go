package idem

import (
	"net/http"
	"slices"
	"unsafe"
)

// lineSource is a response's header lines as the handler left them: an
// http.Header (names sorted, so that an encoding is a function of the
// response) or a [HeaderLines] (names in the order of their first lines).
// Both reach the store through one filter ([storedLines]) and one encoder.
// They are pulled with next, not pushed to a callback or ranged as an
// iter.Seq2: a func value the compiler cannot see through would make every
// HeaderLines escape to the heap.
type lineSource struct {
	h     http.Header
	names []string // h's names, sorted
	l     *HeaderLines

	i, j  int  // the current name (h: names[i]; l: its first line i) and the next value (h: h[names[i]][j]; l: line j)
	first bool // the line next returned last is the first of its name
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

// next returns the next line, lines of one name in a row, or ok = false
// after the last; names and values are read-only.
func (ls *lineSource) next() (k, v string, ok bool) {
	if ls.l == nil {
		for ; ls.i < len(ls.names); ls.i, ls.j = ls.i+1, 0 {
			if vs := ls.h[ls.names[ls.i]]; ls.j < len(vs) {
				ls.first = ls.j == 0
				ls.j++
				return ls.names[ls.i], vs[ls.j-1], true
			}
		}
		return "", "", false
	}
	l := ls.l
	for ls.i < l.count {
		name, _ := l.line(ls.i)
		for ; ls.j < l.count; ls.j++ {
			if nk, nv := l.line(ls.j); string(nk) == string(name) {
				ls.first = ls.j == ls.i
				ls.j++
				return view(nk), view(nv), true
			}
		}
		for ls.i++; ls.i < l.count; ls.i++ { // the first line of the next name
			if nk, _ := l.line(ls.i); !l.seen(ls.i, nk) {
				break
			}
		}
		ls.j = ls.i
	}
	return "", "", false
}

// rewind makes next start again from the first line.
func (ls *lineSource) rewind() { ls.i, ls.j, ls.first = 0, 0, false }

// storedLines pulls the lines of src worth replaying: those the handler
// set (a name whose lines are exactly outer's belongs to the outer
// exchange), minus the unstored names ([WithUnstoredHeaders]), and only
// allowlisted ones under [WithStoredHeaders].
// Its methods store no string (only indexes and flags): a string stored
// through a pointer would make the HeaderLines it points into escape.
type storedLines struct {
	e    *Engine
	src  *lineSource
	same []bool // per name of src, in order: its lines are outer's
	run  int    // the current name's index in same
	keep bool   // the current name's lines are stored
}

// next returns the next stored line, or ok = false after the last.
func (f *storedLines) next() (k, v string, ok bool) {
	for {
		k, v, ok = f.src.next()
		if !ok {
			return "", "", false
		}
		if f.src.first {
			f.run++
			f.keep = f.e.storesName(k) && (f.run >= len(f.same) || !f.same[f.run])
		}
		if f.keep {
			return k, v, true
		}
	}
}

func (f *storedLines) rewind() {
	f.src.rewind()
	f.run, f.keep = -1, false
}

// sameAsOuter appends to same, for each name of src in order, whether its
// lines are exactly outer's (same values, same order).
func sameAsOuter(src *lineSource, outer http.Header, same []bool) []bool {
	src.rewind()
	run, n := -1, 0
	var ov []string
	for k, v, ok := src.next(); ok; k, v, ok = src.next() {
		if src.first {
			if run >= 0 {
				same[run] = same[run] && n == len(ov)
			}
			run++
			ov, n = outer[k], 0
			same = append(same, ov != nil)
		}
		if same[run] {
			same[run] = n < len(ov) && ov[n] == v
			n++
		}
	}
	if run >= 0 {
		same[run] = same[run] && n == len(ov)
	}
	return same
}

// encodeLines starts the encoding of the lines of src worth replaying
// (see storedLines): in buf, a recycled buffer whose bytes are
// overwritten (appends grow it when it is short), or when buf is nil in a
// new buffer sized for the lines and extra body bytes after them.
func (e *Engine) encodeLines(src *lineSource, outer http.Header, extra int, buf []byte) encoder {
	var stack [64]bool
	f := storedLines{e: e, src: src, same: stack[:0]}
	if len(outer) > 0 {
		f.same = sameAsOuter(src, outer, f.same)
	}
	f.rewind()
	var w encoder
	if cap(buf) >= headroom {
		w = encoder{b: buf[:headroom], at: -1}
	} else {
		size := 0
		for k, v, ok := f.next(); ok; k, v, ok = f.next() {
			size += lineSize(k, v, f.src.first)
		}
		w = newEncoder(size + extra)
		f.rewind()
	}
	for k, v, ok := f.next(); ok; k, v, ok = f.next() {
		w.line(k, v)
	}
	w.endLines()
	return w
}

// encodeAll returns the encoding of r with all its lines (the engine's own
// answers, which no header policy applies to).
func encodeAll(r *Response) []byte {
	var stack [16]string
	src := headerLines(r.Header, &stack)
	size := 0
	for k, v, ok := src.next(); ok; k, v, ok = src.next() {
		size += lineSize(k, v, src.first)
	}
	w := newEncoder(size + len(r.Body))
	src.rewind()
	for k, v, ok := src.next(); ok; k, v, ok = src.next() {
		w.line(k, v)
	}
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
