package idemconnect

import (
	"errors"
	"strconv"
	"time"

	"connectrpc.com/connect"
	"github.com/idemkit/idem/adapters/idemrpc"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/types/known/anypb"
)

// HTTPStatus returns the HTTP status an outcome with code is recorded under,
// the status the engine's store policy decides on. It is
// [idemrpc.HTTPStatus] (Connect's codes are gRPC's), whose documentation
// has the table.
func HTTPStatus(code connect.Code) int { return idemrpc.HTTPStatus(uint32(code)) }

// ErrorDomain is the domain of the google.rpc.ErrorInfo detail on idem's own
// answers ([idemrpc.ErrorDomain]).
const ErrorDomain = idemrpc.ErrorDomain

// statusError returns st as a Connect error with its code, message and
// details, and with Retry-After in its metadata when retryAfter > 0 (read
// by HTTP clients of the Connect protocol).
func statusError(st *spb.Status, retryAfter time.Duration) *connect.Error {
	ce := connect.NewError(connect.Code(st.GetCode()), errors.New(st.GetMessage()))
	for _, a := range st.GetDetails() {
		if d, err := connect.NewErrorDetail(a); err == nil {
			ce.AddDetail(d)
		}
	}
	if retryAfter > 0 {
		ce.Meta().Set("Retry-After", strconv.Itoa(int((retryAfter+time.Second-1)/time.Second)))
	}
	return ce
}

// toStatus returns err as a google.rpc.Status and its metadata (nil for an
// error that is not a *connect.Error).
func toStatus(err error) (*spb.Status, *connect.Error) {
	st := &spb.Status{Code: int32(connect.CodeOf(err)), Message: err.Error()}
	ce := new(connect.Error)
	if !errors.As(err, &ce) {
		return st, nil
	}
	st.Message = ce.Message()
	for _, d := range ce.Details() {
		st.Details = append(st.Details, &anypb.Any{TypeUrl: "type.googleapis.com/" + d.Type(), Value: d.Bytes()})
	}
	return st, ce
}
