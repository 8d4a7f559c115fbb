package idemgrpc

import (
	"errors"

	"google.golang.org/protobuf/encoding/protowire"
)

// envelope is the stored form of one unary call's outcome: the body of the
// idem.Response a record holds (its Status is [HTTPStatus] of the code, its
// Header empty). It is a protocol buffers message written with protowire:
//
//	1 string  full name of the response message (successes only)
//	2 bytes   the response message, deterministic encoding
//	3 Entry   header metadata, repeated (Entry: 1 lowercase name, 2 value; raw bytes for -bin names)
//	4 Entry   trailer metadata, repeated
//	5 bytes   google.rpc.Status (errors only)
//
// idemconnect stores the same envelope, so a call executed through one door
// is replayed through the other.
type envelope struct {
	typeName        string
	message         []byte
	header, trailer []entry
	status          []byte
}

type entry struct{ name, value string }

func (v *envelope) marshal() []byte {
	n := len(v.typeName) + len(v.message) + len(v.status) + 16
	for _, e := range v.header {
		n += len(e.name) + len(e.value) + 8
	}
	for _, e := range v.trailer {
		n += len(e.name) + len(e.value) + 8
	}
	b := make([]byte, 0, n)
	if v.typeName != "" {
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendString(b, v.typeName)
	}
	if v.message != nil {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendBytes(b, v.message)
	}
	b = appendEntries(b, 3, v.header)
	b = appendEntries(b, 4, v.trailer)
	if v.status != nil {
		b = protowire.AppendTag(b, 5, protowire.BytesType)
		b = protowire.AppendBytes(b, v.status)
	}
	return b
}

func appendEntries(b []byte, field protowire.Number, es []entry) []byte {
	for _, e := range es {
		b = protowire.AppendTag(b, field, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(protowire.SizeTag(1)*2+protowire.SizeBytes(len(e.name))+protowire.SizeBytes(len(e.value))))
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendString(b, e.name)
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendString(b, e.value)
	}
	return b
}

var errEnvelope = errors.New("idemgrpc: stored response is not an RPC envelope")

func (v *envelope) unmarshal(b []byte) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return errEnvelope
		}
		b = b[n:]
		if typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return errEnvelope
			}
			b = b[n:]
			continue
		}
		val, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return errEnvelope
		}
		b = b[n:]
		switch num {
		case 1:
			v.typeName = string(val)
		case 2:
			v.message = val
		case 3, 4:
			e, err := unmarshalEntry(val)
			if err != nil {
				return err
			}
			if num == 3 {
				v.header = append(v.header, e)
			} else {
				v.trailer = append(v.trailer, e)
			}
		case 5:
			v.status = val
		}
	}
	return nil
}

func unmarshalEntry(b []byte) (entry, error) {
	var e entry
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.BytesType {
			return e, errEnvelope
		}
		b = b[n:]
		val, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return e, errEnvelope
		}
		b = b[n:]
		switch num {
		case 1:
			e.name = string(val)
		case 2:
			e.value = string(val)
		}
	}
	return e, nil
}
