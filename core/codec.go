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
	var stack [16]string
	names := stack[:0]
	size := 1 + 2*binary.MaxVarintLen64 + len(r.Body)
	for k, vs := range r.Header {
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
	b = binary.AppendUvarint(b, uint64(len(r.Header)))
	for _, k := range names {
		b = appendString(b, k)
		vs := r.Header[k]
		b = binary.AppendUvarint(b, uint64(len(vs)))
		for _, v := range vs {
			b = appendString(b, v)
		}
	}
	return append(b, r.Body...), nil
}

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// UnmarshalBinary decodes what [Response.MarshalBinary] produced into r,
// copying out of data: all header names and values share one string
// allocation, the body gets its own. It implements encoding.BinaryUnmarshaler.
func (r *Response) UnmarshalBinary(data []byte) error {
	// First pass: validate and size, without allocating.
	d := decoder{b: data}
	if d.byte() != codecVersion {
		return errCorrupt
	}
	status := d.uvarint()
	n := d.uvarint()
	if d.err || status > 999 || n > uint64(len(d.b)) {
		return errCorrupt
	}
	total := uint64(0)
	for range n {
		d.skip()
		nv := d.uvarint()
		if d.err || nv > uint64(len(d.b)) {
			return errCorrupt
		}
		for range nv {
			d.skip()
		}
		total += nv
	}
	if d.err {
		return errCorrupt
	}
	headerEnd := len(data) - len(d.b)
	// Second pass: one copy of data holds the body (the caller's to modify)
	// and, before it, the header names and values as one string that no
	// slice reaches (body is cut with its capacity starting at headerEnd).
	all := make([]byte, len(data))
	copy(all, data)
	body := all[headerEnd:len(data):len(data)]
	str := unsafe.String(unsafe.SliceData(all), headerEnd)
	sd := strDecoder{s: str[1:]}
	sd.uvarint()
	sd.uvarint()
	h := make(http.Header, n+1) // room for the replay's Idempotent-Replayed line
	values := make([]string, total)
	for range n {
		k := sd.string()
		nv := int(sd.uvarint())
		vs := values[:nv:nv]
		values = values[nv:]
		for j := range vs {
			vs[j] = sd.string()
		}
		h[k] = vs
	}
	r.Status, r.Header, r.Body = int(status), h, body
	return nil
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
