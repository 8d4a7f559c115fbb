package idemgrpc

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	idem "github.com/idemkit/idem/core"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
)

// HTTPStatus returns the HTTP status an outcome with code is recorded under,
// the status the engine's store policy ([idem.WithStorePolicy]) decides on:
// with the default policy the deterministic client errors are stored and
// replayed, the transient ones release the key so that a retry executes
// again. It follows google.rpc.Code's HTTP mapping except where that mapping
// would put a code on the wrong side of the default policy or share a
// status between codes that need different answers:
//
//	code                status  default policy
//	OK                  200     stored
//	InvalidArgument     400     stored
//	FailedPrecondition  412     stored (google.rpc: 400)
//	OutOfRange          416     stored (google.rpc: 400)
//	Unauthenticated     401     stored
//	PermissionDenied    403     stored
//	NotFound            404     stored
//	AlreadyExists       422     stored (google.rpc: 409, which the default policy releases as a transient conflict)
//	Canceled            408     released (google.rpc: 499, a 4xx the default policy would store)
//	Aborted             409     released
//	ResourceExhausted   429     released
//	Unknown, Internal, DataLoss  500  released
//	Unimplemented       501     released
//	Unavailable         503     released
//	DeadlineExceeded    504     released
func HTTPStatus(code codes.Code) int {
	switch code {
	case codes.OK:
		return http.StatusOK
	case codes.InvalidArgument:
		return http.StatusBadRequest
	case codes.FailedPrecondition:
		return http.StatusPreconditionFailed
	case codes.OutOfRange:
		return http.StatusRequestedRangeNotSatisfiable
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.NotFound:
		return http.StatusNotFound
	case codes.AlreadyExists:
		return http.StatusUnprocessableEntity
	case codes.Canceled:
		return http.StatusRequestTimeout
	case codes.Aborted:
		return http.StatusConflict
	case codes.ResourceExhausted:
		return http.StatusTooManyRequests
	case codes.Unimplemented:
		return http.StatusNotImplemented
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError // Unknown, Internal, DataLoss, codes outside the list
}

// ErrorDomain is the domain of the google.rpc.ErrorInfo detail on idem's own
// answers; its reason names the case (KEY_MISSING, KEY_MALFORMED,
// NO_PRINCIPAL, IN_PROGRESS, KEY_REUSED, BODY_TOO_LARGE,
// RESPONSE_NOT_STORED, STORE_UNAVAILABLE, STORED_RESULT_UNREADABLE), the
// problem types of the README's behaviour table in upper snake case.
const ErrorDomain = "idem.idemkit.github.com"

// problemStatus turns an answer of the engine that is not a replay (an RFC
// 9457 problem, or the app's rendering of one) into a gRPC status with
// google.rpc details. keyName names the metadata the key travels in; keys
// are its values in the request.
func problemStatus(resp *idem.Response, keyName string, keys []string) *status.Status {
	var p idem.Problem
	_ = json.Unmarshal(resp.Body, &p) // a custom renderer's body: p stays empty
	slug, _ := strings.CutPrefix(p.Type, idem.ProblemTypeBase)
	var code codes.Code
	var msg string
	var details []protoadapt.MessageV1
	retry := func() {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(retryAfter(resp))})
	}
	switch resp.Status {
	case http.StatusBadRequest:
		code, slug = codes.InvalidArgument, "key-malformed"
		_, err := idem.ParseKey(keys)
		switch {
		case errors.Is(err, idem.ErrKeyMissing):
			slug, msg = "key-missing", "this method requires "+keyName+" metadata: a unique value, e.g. a UUID, sent again unchanged with every retry"
		case err != nil:
			msg = keyName + " metadata malformed: " + err.Error()
		case p.Detail != "":
			msg = p.Detail // refused by the engine's key validator
		default:
			msg = keyName + " metadata refused"
		}
		details = append(details, &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: keyName, Description: msg}}})
	case http.StatusUnauthorized:
		code, slug, msg = codes.Unauthenticated, "no-principal", "idempotency keys are scoped to the authenticated caller; this call has none"
	case http.StatusConflict:
		code, slug, msg = codes.Aborted, "in-progress", "a call with this idempotency key is in progress; retry after the RetryInfo delay to get its result"
		retry()
	case http.StatusUnprocessableEntity:
		code, slug, msg = codes.FailedPrecondition, "key-reused", "this idempotency key was already used with a different request (method or message); use a new key for a new request"
		details = append(details, &errdetails.PreconditionFailure{Violations: []*errdetails.PreconditionFailure_Violation{{Type: "IDEMPOTENCY_KEY", Subject: keyName, Description: msg}}})
	case http.StatusRequestEntityTooLarge:
		code, slug, msg = codes.ResourceExhausted, "body-too-large", "the request message is larger than this service accepts for idempotent calls; nothing was executed"
	case http.StatusGone:
		code, slug, msg = codes.FailedPrecondition, "response-not-stored", "the call with this idempotency key was executed once, but its response was too large to store and cannot be replayed"
	case http.StatusServiceUnavailable:
		code, slug, msg = codes.Unavailable, "store-unavailable", "the idempotency store could not be reached, so the call was not executed; it is safe to retry with the same key"
		retry()
	case http.StatusInternalServerError:
		code, slug, msg = codes.Internal, "stored-result-unreadable", "the call with this idempotency key was recorded, but its stored result cannot be read; retrying will not help until the operator clears the record"
	default:
		code, msg = codes.Unknown, p.Detail
	}
	info := &errdetails.ErrorInfo{Domain: ErrorDomain, Reason: strings.ToUpper(strings.ReplaceAll(slug, "-", "_"))}
	if p.OriginalStatus != 0 {
		info.Metadata = map[string]string{"original_status": strconv.Itoa(p.OriginalStatus)}
	}
	st, err := status.New(code, msg).WithDetails(append([]protoadapt.MessageV1{info}, details...)...)
	if err != nil {
		return status.New(code, msg)
	}
	return st
}

// retryAfter returns the Retry-After delay of resp (1s when absent).
func retryAfter(resp *idem.Response) time.Duration {
	d := time.Second
	resp.EachHeader(func(name, value string) {
		if name == "Retry-After" {
			if s, err := strconv.Atoi(value); err == nil && s >= 0 {
				d = time.Duration(s) * time.Second
			}
		}
	})
	return d
}
