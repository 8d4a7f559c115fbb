package idemrpc

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	idem "github.com/idemkit/idem/core"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// The gRPC status codes (google.rpc.Code), which Connect shares.
const (
	OK                 uint32 = 0
	Canceled           uint32 = 1
	Unknown            uint32 = 2
	InvalidArgument    uint32 = 3
	DeadlineExceeded   uint32 = 4
	NotFound           uint32 = 5
	AlreadyExists      uint32 = 6
	PermissionDenied   uint32 = 7
	ResourceExhausted  uint32 = 8
	FailedPrecondition uint32 = 9
	Aborted            uint32 = 10
	OutOfRange         uint32 = 11
	Unimplemented      uint32 = 12
	Internal           uint32 = 13
	Unavailable        uint32 = 14
	DataLoss           uint32 = 15
	Unauthenticated    uint32 = 16
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
func HTTPStatus(code uint32) int {
	switch code {
	case OK:
		return http.StatusOK
	case InvalidArgument:
		return http.StatusBadRequest
	case FailedPrecondition:
		return http.StatusPreconditionFailed
	case OutOfRange:
		return http.StatusRequestedRangeNotSatisfiable
	case Unauthenticated:
		return http.StatusUnauthorized
	case PermissionDenied:
		return http.StatusForbidden
	case NotFound:
		return http.StatusNotFound
	case AlreadyExists:
		return http.StatusUnprocessableEntity
	case Canceled:
		return http.StatusRequestTimeout
	case Aborted:
		return http.StatusConflict
	case ResourceExhausted:
		return http.StatusTooManyRequests
	case Unimplemented:
		return http.StatusNotImplemented
	case Unavailable:
		return http.StatusServiceUnavailable
	case DeadlineExceeded:
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

// Answer turns an answer of the engine that is not a replay (an RFC 9457
// problem, or the app's rendering of one) into a google.rpc.Status with
// details: always an ErrorInfo{Domain: ErrorDomain}, then BadRequest (key
// missing or malformed), PreconditionFailure (key reused) or RetryInfo (in
// progress, store unavailable). keyName names where the key travels
// ("idempotency-key"), keyKind what that is ("metadata", "header"); keys
// are its values in the request. retryAfter is the RetryInfo delay, 0
// without one.
func Answer(resp *idem.Response, keyName, keyKind string, keys []string) (st *spb.Status, retryAfter time.Duration) {
	var p idem.Problem
	_ = json.Unmarshal(resp.Body, &p) // a custom renderer's body: p stays empty
	slug, _ := strings.CutPrefix(p.Type, idem.ProblemTypeBase)
	var code uint32
	var msg string
	var details []proto.Message
	switch resp.Status {
	case http.StatusBadRequest:
		code, slug = InvalidArgument, "key-malformed"
		_, err := idem.ParseKey(keys)
		switch {
		case errors.Is(err, idem.ErrKeyMissing):
			slug, msg = "key-missing", "this method requires "+keyName+" "+keyKind+": a unique value, e.g. a UUID, sent again unchanged with every retry"
		case err != nil:
			msg = keyName + " " + keyKind + " malformed: " + strings.TrimPrefix(err.Error(), "idem: ")
		case p.Detail != "":
			msg = p.Detail // refused by the engine's key validator
		default:
			msg = keyName + " " + keyKind + " refused"
		}
		details = append(details, &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: keyName, Description: msg}}})
	case http.StatusUnauthorized:
		code, slug, msg = Unauthenticated, "no-principal", "idempotency keys are scoped to the authenticated caller; this call has none"
	case http.StatusConflict:
		code, slug, msg, retryAfter = Aborted, "in-progress", "a call with this idempotency key is in progress; retry after the RetryInfo delay to get its result", retryAfterOf(resp)
	case http.StatusUnprocessableEntity:
		code, slug, msg = FailedPrecondition, "key-reused", "this idempotency key was already used with a different request (method or message); use a new key for a new request"
		details = append(details, &errdetails.PreconditionFailure{Violations: []*errdetails.PreconditionFailure_Violation{{Type: "IDEMPOTENCY_KEY", Subject: keyName, Description: msg}}})
	case http.StatusRequestEntityTooLarge:
		code, slug, msg = ResourceExhausted, "body-too-large", "the request message is larger than this service accepts for idempotent calls; nothing was executed"
	case http.StatusGone:
		code, slug, msg = FailedPrecondition, "response-not-stored", "the call with this idempotency key was executed once, but its response was too large to store and cannot be replayed"
	case http.StatusServiceUnavailable:
		code, slug, msg, retryAfter = Unavailable, "store-unavailable", "the idempotency store could not be reached, so the call was not executed; it is safe to retry with the same key", retryAfterOf(resp)
	case http.StatusInternalServerError:
		code, slug, msg = Internal, "stored-result-unreadable", "the call with this idempotency key was recorded, but its stored result cannot be read; retrying will not help until the operator clears the record"
	default:
		code, msg = Unknown, p.Detail
	}
	info := &errdetails.ErrorInfo{Domain: ErrorDomain, Reason: strings.ToUpper(strings.ReplaceAll(slug, "-", "_"))}
	if p.OriginalStatus != 0 {
		info.Metadata = map[string]string{"original_status": strconv.Itoa(p.OriginalStatus)}
	}
	details = append([]proto.Message{info}, details...)
	if retryAfter > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(retryAfter)})
	}
	st = &spb.Status{Code: int32(code), Message: msg}
	for _, d := range details {
		if a, err := anypb.New(d); err == nil {
			st.Details = append(st.Details, a)
		}
	}
	return st, retryAfter
}

// retryAfterOf returns the Retry-After delay of resp (1s when absent).
func retryAfterOf(resp *idem.Response) time.Duration {
	d := time.Second
	resp.EachHeader(func(name, value string) {
		if name == "Retry-After" {
			if s, err := strconv.Atoi(value); err == nil && s > 0 {
				d = time.Duration(s) * time.Second
			}
		}
	})
	return d
}
