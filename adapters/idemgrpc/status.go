package idemgrpc

import (
	"github.com/idemkit/idem/adapters/idemrpc"
	"google.golang.org/grpc/codes"
)

// HTTPStatus returns the HTTP status an outcome with code is recorded under,
// the status the engine's store policy ([idem.WithStorePolicy]) decides on.
// It is [idemrpc.HTTPStatus], whose documentation has the table: by
// default OK and the deterministic client errors (InvalidArgument,
// FailedPrecondition, OutOfRange, Unauthenticated, PermissionDenied,
// NotFound, AlreadyExists) are stored; Canceled, Aborted,
// ResourceExhausted, Unknown, Internal, DataLoss, Unimplemented,
// Unavailable and DeadlineExceeded release the key.
func HTTPStatus(code codes.Code) int { return idemrpc.HTTPStatus(uint32(code)) }

// ErrorDomain is the domain of the google.rpc.ErrorInfo detail on idem's own
// answers ([idemrpc.ErrorDomain]).
const ErrorDomain = idemrpc.ErrorDomain
