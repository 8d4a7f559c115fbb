package idem

import (
	"encoding/binary"
	"errors"
	"net/http"
	"slices"
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
	b = append(b, codecVersion)
	b = binary.AppendUvarint(b, uint64(r.Status))
	b = binary.AppendUvarint(b, uint64(len(r.Header)))
	names := make([]string, 0, len(r.Header))
	for k := range r.Header {
		names = append(names, k)
	}
	slices.Sort(names)
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
// copying out of data. It implements encoding.BinaryUnmarshaler.
func (r *Response) UnmarshalBinary(data []byte) error {
	d := decoder{b: data}
	if d.byte() != codecVersion {
		return errCorrupt
	}
	status := d.uvarint()
	n := d.uvarint()
	if d.err || status > 999 || n > uint64(len(d.b)) {
		return errCorrupt
	}
	h := make(http.Header, n)
	for range n {
		k := d.string()
		nv := d.uvarint()
		if d.err || nv > uint64(len(d.b)) {
			return errCorrupt
		}
		vs := make([]string, nv)
		for j := range vs {
			vs[j] = d.string()
		}
		h[k] = vs
	}
	if d.err {
		return errCorrupt
	}
	r.Status, r.Header, r.Body = int(status), h, cloneBytes(d.b)
	if r.Body == nil {
		r.Body = []byte{}
	}
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

func (d *decoder) string() string {
	n := d.uvarint()
	if d.err || n > uint64(len(d.b)) {
		d.err = true
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}
