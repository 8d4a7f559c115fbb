package idem

import (
	"encoding/binary"
	"fmt"
	"net/http"
	"slices"
	"sync/atomic"
	"unsafe"
)

// The encoding of a response, the bytes a [Store] keeps ([Record.Response]):
// version byte, uvarint status, uvarint number of header names, then per
// name uvarint-length-prefixed name, uvarint value count and
// length-prefixed values, then the body bytes to the end. Binary-safe:
// bodies and header values may hold any byte.
const codecVersion = 1

// errCorrupt is returned for bytes the encoder did not produce.
var errCorrupt = fmt.Errorf("%w: the response does not decode", ErrCorrupt)

// headroom is the most bytes the head of an encoding takes (version,
// status, number of names): an encoder reserves it before the header
// lines, whose number of names it learns only after writing them.
const headroom = 1 + 2*binary.MaxVarintLen64

// lineSize bounds from above the encoded size of the header line k: v,
// the first of its name when first.
func lineSize(k, v string, first bool) int {
	n := binary.MaxVarintLen64 + len(v)
	if first {
		n += 1 + binary.MaxVarintLen64 + len(k)
	}
	return n
}

// encoder writes an encoding: the header lines one at a time (lines of
// one name in a row), then the body appended to b, then the head.
type encoder struct {
	b     []byte
	names int
	count int // values of the current name
	at    int // where the current name's value count goes (its name ends there); -1: none yet
	name  int // where the current name starts in b
}

// newEncoder returns an encoder whose buffer holds the headroom and has
// room for size more bytes.
func newEncoder(size int) encoder {
	return encoder{b: make([]byte, headroom, headroom+size), at: -1}
}

// line appends the header line k: v.
func (w *encoder) line(k, v string) {
	if w.at < 0 || k != string(w.b[w.name:w.at]) { // compared with the name written, so that w keeps no pointer to k
		w.putCount()
		w.b = binary.AppendUvarint(w.b, uint64(len(k)))
		w.name = len(w.b)
		w.b = append(w.b, k...)
		w.at, w.count = len(w.b), 0
		w.b = append(w.b, 0) // the value count, written when known
		w.names++
	}
	w.b = appendString(w.b, v)
	w.count++
}

// endLines ends the header lines: what is appended to w.b next is the body.
func (w *encoder) endLines() {
	w.putCount()
	w.at = -1
}

// putCount writes the value count of the current name at w.b[w.at],
// where one byte is reserved, moving what follows when it takes more.
func (w *encoder) putCount() {
	if w.at < 0 {
		return
	}
	if w.count < 0x80 {
		w.b[w.at] = byte(w.count)
		return
	}
	var v [binary.MaxVarintLen64]byte
	n := binary.PutUvarint(v[:], uint64(w.count))
	w.b = slices.Insert(w.b, w.at+1, v[1:n]...)
	copy(w.b[w.at:], v[:n])
}

// encoding writes the head into the headroom and returns the encoding:
// the lines (ended by endLines) and the body after them.
func (w *encoder) encoding(status int) []byte {
	var h [headroom]byte
	h[0] = codecVersion
	n := 1 + binary.PutUvarint(h[1:], uint64(status))
	n += binary.PutUvarint(h[n:], uint64(w.names))
	return w.b[headroom-copy(w.b[headroom-n:headroom], h[:n]):]
}

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// EncodeResponse returns the engine's encoding of r, as [Store.Complete]
// and [Keeper.Resolve] take it: status, every header line and the body,
// readable by [DecodeResponse]. For operators' tools that complete a
// record by hand (cmd/idemctl complete); the engine encodes its own
// responses while capturing them.
func EncodeResponse(r *Response) []byte { return encodeAll(r) }

// DecodeResponse decodes a stored response ([Record.Response], as
// [Store.Get], [Store.Acquire] and [Inspector.Inspect] return it) into a
// new Response, copying out of b: all header names and values share one
// string allocation, the body gets its own. Bytes the [Engine] did not
// encode return an error wrapping [ErrCorrupt]. For operators' tools
// (cmd/idemctl) and tests; the engine replays from the bytes in place.
func DecodeResponse(b []byte) (*Response, error) {
	l, ok := scanEncoding(b)
	if !ok {
		return nil, errCorrupt
	}
	// One copy of b holds the body (the caller's to modify) and, before
	// it, the header names and values as one string that no slice reaches
	// (body is cut with its capacity starting at headerEnd).
	all := make([]byte, len(b))
	copy(all, b)
	body := all[l.headerEnd:len(b):len(b)]
	sd := strDecoder{s: unsafe.String(unsafe.SliceData(all), l.headerEnd)[l.linesStart:]}
	h := make(http.Header, l.names+1) // room for a replay's Idempotent-Replayed line
	fillHeader(&sd, l.names, h, make([]string, l.values))
	return &Response{Status: l.status, Header: h, Body: body}, nil
}

// layout is where the parts of a valid encoding lie.
type layout struct {
	status, names, values int // names and values: header lines' counts
	linesStart, headerEnd int // the header names and values are data[linesStart:headerEnd]; the body follows
}

// scanEncoding validates data as an encoding without allocating.
func scanEncoding(data []byte) (layout, bool) {
	d := decoder{b: data}
	if d.byte() != codecVersion {
		return layout{}, false
	}
	status := d.uvarint()
	n := d.uvarint()
	if d.err || status > 999 || n > uint64(len(d.b)) {
		return layout{}, false
	}
	l := layout{status: int(status), names: int(n), linesStart: len(data) - len(d.b)}
	for range n {
		d.skip()
		nv := d.uvarint()
		if d.err || nv > uint64(len(d.b)) {
			return layout{}, false
		}
		for range nv {
			d.skip()
		}
		l.values += int(nv)
	}
	if d.err {
		return layout{}, false
	}
	l.headerEnd = len(data) - len(d.b)
	return l, true
}

// sharedReplay returns the replay of the response encoded in data, reading
// it in place: Body and the header lines ([Response.EachHeader]) alias
// data, which the store never modifies afterwards. Header is nil. With
// send (a net/http based adapter will write it with [Response.Send]), the
// same allocation holds room for the header values Send sets.
func sharedReplay(data []byte, send bool) (*Response, error) {
	l, ok := scanEncoding(data)
	if !ok {
		return nil, errCorrupt
	}
	if !send {
		r := new(struct { // one allocation for both
			resp Response
			wire wire
		})
		r.wire.read(data, l)
		r.resp = Response{Status: l.status, Body: data[l.headerEnd:len(data):len(data)], wire: &r.wire}
		return &r.resp, nil
	}
	r := new(sendReplay)
	r.wire.read(data, l)
	r.wire.room = true
	r.resp = Response{Status: l.status, Body: data[l.headerEnd:len(data):len(data)], wire: &r.wire}
	return &r.resp, nil
}

// sendReplay is a replay with room for the header values [Response.Send]
// sets (4 stored values, the replay marker's and Content-Length's), in one
// allocation; the first fill takes them, later ones allocate their own.
type sendReplay struct {
	wire   wire // first: a *wire with room is a *sendReplay
	resp   Response
	taken  atomic.Bool
	values [sendRoom]string
}

// sendRoom is the number of values in a sendReplay.
const sendRoom = 6

// takeRoom returns the first n of values of the sendReplay whose wire w
// is, once, when w has room and n fit; else nil.
func (w *wire) takeRoom(n int) []string {
	if !w.room || n > sendRoom {
		return nil
	}
	r := (*sendReplay)(unsafe.Pointer(w))
	if !r.taken.CompareAndSwap(false, true) {
		return nil
	}
	return r.values[:n]
}

// wire is the header of a replay read in place by sharedReplay: the
// encoded header names and values and their counts.
type wire struct {
	lines    string
	names    int32
	values   int32
	replayed bool // the line "Idempotent-Replayed: true" follows them
	room     bool // w is the wire of a sendReplay
}

// read sets w to the lines of the valid encoding data laid out as l, with
// the replay marker.
func (w *wire) read(data []byte, l layout) {
	w.lines = unsafe.String(unsafe.SliceData(data[l.linesStart:]), l.headerEnd-l.linesStart)
	w.names, w.values, w.replayed = int32(l.names), int32(l.values), true
}

// fillHeader reads names header names, each with its values, from d into
// h; the value slices are cut from values, capped so that an append
// copies. It returns what is left of values.
func fillHeader(d *strDecoder, names int, h http.Header, values []string) []string {
	for range names {
		k := d.string()
		nv := int(d.uvarint())
		vs := values[:nv:nv]
		values = values[nv:]
		for j := range vs {
			vs[j] = d.string()
		}
		h[k] = vs
	}
	return values
}

type decoder struct {
	b   []byte
	err bool
}

func (d *decoder) byte() byte {
	if len(d.b) == 0 {
		d.err = true
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = true
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) skip() {
	n := d.uvarint()
	if d.err || n > uint64(len(d.b)) {
		d.err = true
		return
	}
	d.b = d.b[n:]
}

// strDecoder reads what decoder validated, as substrings.
type strDecoder struct{ s string }

func (d *strDecoder) uvarint() uint64 {
	var v uint64
	for shift := 0; ; shift += 7 {
		c := d.s[0]
		d.s = d.s[1:]
		v |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return v
		}
	}
}

func (d *strDecoder) string() string {
	n := d.uvarint()
	s := d.s[:n]
	d.s = d.s[n:]
	return s
}
