package idemrpc

import (
	"errors"

	"google.golang.org/protobuf/encoding/protowire"
)

// Outcome is the stored form of one unary call's outcome: the body of the
// idem.Response a record holds (its Status is [HTTPStatus] of the code, its
// Header empty). It is encoded as a protocol buffers message, written with
// protowire:
//
//	1 string  full name of the response message (successes only)
//	2 bytes   the response message, deterministic encoding
//	3 Entry   header metadata, repeated (Entry: 1 lowercase name, 2 value; raw bytes for -bin names)
//	4 Entry   trailer metadata, repeated
//	5 bytes   google.rpc.Status (errors only)
//
// idemgrpc and idemconnect both store it, so a call executed through one is
// replayed through the other.
type Outcome struct {
	// TypeName is the full name of the response message (successes only).
	TypeName string
	// Message is the response message's deterministic encoding.
	Message []byte
	// Header and Trailer are the response metadata worth replaying, with
	// lowercase names; values of "-bin" names are the raw bytes.
	Header, Trailer []Entry
	// Status is the encoded google.rpc.Status of an error; nil for a success.
	Status []byte
}

// Entry is one metadata line.
type Entry struct{ Name, Value string }

// Marshal returns the encoding of v.
func (v *Outcome) Marshal() []byte {
	n := len(v.TypeName) + len(v.Message) + len(v.Status) + 16
	for _, e := range v.Header {
		n += len(e.Name) + len(e.Value) + 8
	}
	for _, e := range v.Trailer {
		n += len(e.Name) + len(e.Value) + 8
	}
	b := make([]byte, 0, n)
	if v.TypeName != "" {
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendString(b, v.TypeName)
	}
	if v.Message != nil {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendBytes(b, v.Message)
	}
	b = appendEntries(b, 3, v.Header)
	b = appendEntries(b, 4, v.Trailer)
	if v.Status != nil {
		b = protowire.AppendTag(b, 5, protowire.BytesType)
		b = protowire.AppendBytes(b, v.Status)
	}
	return b
}

func appendEntries(b []byte, field protowire.Number, es []Entry) []byte {
	for _, e := range es {
		b = protowire.AppendTag(b, field, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(protowire.SizeTag(1)*2+protowire.SizeBytes(len(e.Name))+protowire.SizeBytes(len(e.Value))))
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendString(b, e.Name)
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendString(b, e.Value)
	}
	return b
}

// ErrNotOutcome reports stored bytes that are not an encoded [Outcome].
var ErrNotOutcome = errors.New("idemrpc: stored response is not an RPC outcome")

// Unmarshal decodes b into v; it returns [ErrNotOutcome] for bytes that are
// not an encoded Outcome. v aliases b.
func (v *Outcome) Unmarshal(b []byte) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return ErrNotOutcome
		}
		b = b[n:]
		if typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return ErrNotOutcome
			}
			b = b[n:]
			continue
		}
		val, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return ErrNotOutcome
		}
		b = b[n:]
		switch num {
		case 1:
			v.TypeName = string(val)
		case 2:
			v.Message = val
		case 3, 4:
			e, err := unmarshalEntry(val)
			if err != nil {
				return err
			}
			if num == 3 {
				v.Header = append(v.Header, e)
			} else {
				v.Trailer = append(v.Trailer, e)
			}
		case 5:
			v.Status = val
		}
	}
	return nil
}

func unmarshalEntry(b []byte) (Entry, error) {
	var e Entry
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.BytesType {
			return e, ErrNotOutcome
		}
		b = b[n:]
		val, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return e, ErrNotOutcome
		}
		b = b[n:]
		switch num {
		case 1:
			e.Name = string(val)
		case 2:
			e.Value = string(val)
		}
	}
	return e, nil
}
