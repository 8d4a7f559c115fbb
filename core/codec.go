package idem

import (
	"encoding/binary"
	"errors"
	"net/http"
	"slices"
	"unsafe"
)

// errCorrupt is returned by UnmarshalBinary for bytes MarshalBinary did not produce.
var errCorrupt = errors.New("idem: corrupt stored response")

const codecVersion = 1

// MarshalBinary encodes r compactly for stores that keep bytes (binary-safe:
// bodies and header values may hold any byte). Layout: version byte,
// uvarint status, uvarint number of header names, then per name (sorted)
// uvarint-length-prefixed name, uvarint value count and length-prefixed
// values, then the body bytes to the end. It implements encoding.BinaryMarshaler.
func (r *Response) MarshalBinary() ([]byte, error) {
	return r.AppendBinary(nil)
}

// AppendBinary appends the encoding of [Response.MarshalBinary] to b.
func (r *Response) AppendBinary(b []byte) ([]byte, error) {
	if w := r.wire; w != nil && r.Header == nil { // already encoded: copy
		n := w.names
		if w.replayed {
			n++
		}
		b = slices.Grow(b, 1+2*binary.MaxVarintLen64+len(w.lines)+len(replayedLine)+len(r.Body))
		b = append(b, codecVersion)
		b = binary.AppendUvarint(b, uint64(r.Status))
		b = binary.AppendUvarint(b, uint64(n))
		b = append(b, w.lines...)
		if w.replayed {
			b = append(b, replayedLine...)
		}
		return append(b, r.Body...), nil
	}
	header := r.header()
	var stack [16]string
	names := stack[:0]
	size := 1 + 2*binary.MaxVarintLen64 + len(r.Body)
	for k, vs := range header {
		names = append(names, k)
		size += binary.MaxVarintLen64*(2+len(vs)) + len(k)
		for _, v := range vs {
			size += len(v)
		}
	}
	slices.Sort(names)
	b = slices.Grow(b, size)
	b = append(b, codecVersion)
	b = binary.AppendUvarint(b, uint64(r.Status))
	b = binary.AppendUvarint(b, uint64(len(header)))
	for _, k := range names {
		b = appendString(b, k)
		vs := header[k]
		b = binary.AppendUvarint(b, uint64(len(vs)))
		for _, v := range vs {
			b = appendString(b, v)
		}
	}
	return append(b, r.Body...), nil
}

// replayedLine is "Idempotent-Replayed: true" as one encoded header name.
var replayedLine = string(appendString(binary.AppendUvarint(appendString(nil, ReplayedHeader), 1), "true"))

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// UnmarshalBinary decodes what [Response.MarshalBinary] produced into r,
// copying out of data: all header names and values share one string
// allocation, the body gets its own. It implements encoding.BinaryUnmarshaler.
func (r *Response) UnmarshalBinary(data []byte) error {
	l, ok := scanEncoding(data)
	if !ok {
		return errCorrupt
	}
	// One copy of data holds the body (the caller's to modify) and, before
	// it, the header names and values as one string that no slice reaches
	// (body is cut with its capacity starting at headerEnd).
	all := make([]byte, len(data))
	copy(all, data)
	body := all[l.headerEnd:len(data):len(data)]
	sd := strDecoder{s: unsafe.String(unsafe.SliceData(all), l.headerEnd)[l.linesStart:]}
	h := make(http.Header, l.names+1) // room for the replay's Idempotent-Replayed line
	fillHeader(&sd, l.names, h, make([]string, l.values))
	r.Status, r.Header, r.Body = l.status, h, body
	return nil
}

// layout is where the parts of a valid encoding lie.
type layout struct {
	status, names, values int // names and values: header lines' counts
	linesStart, headerEnd int // the header names and values are data[linesStart:headerEnd]; the body follows
}

// scanEncoding validates data as an encoding of [Response.MarshalBinary]
// without allocating.
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
// data, which the store never modifies afterwards. Header is nil.
func sharedReplay(data []byte) (*Response, error) {
	l, ok := scanEncoding(data)
	if !ok {
		return nil, errCorrupt
	}
	r := &struct { // one allocation for both
		resp Response
		wire wire
	}{
		resp: Response{Status: l.status, Body: data[l.headerEnd:len(data):len(data)]},
		wire: wire{lines: unsafe.String(unsafe.SliceData(data[l.linesStart:]), l.headerEnd-l.linesStart), names: int32(l.names), replayed: true},
	}
	r.resp.wire = &r.wire
	return &r.resp, nil
}

// wire is the header of a Response held in its encoded form (a replay read
// in place by sharedReplay, or lines captured by encodeLines): the encoded
// header names and values and their counts.
type wire struct {
	lines    string
	names    int32
	replayed bool // the line "Idempotent-Replayed: true" follows them
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
