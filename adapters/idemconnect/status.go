package idemconnect

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	idem "github.com/idemkit/idem/core"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// HTTPStatus returns the HTTP status an outcome with code is recorded under,
// the status the engine's store policy decides on; it is idemgrpc.HTTPStatus
// (Connect's codes are gRPC's), whose documentation has the table. nil
// errors are recorded as 200.
func HTTPStatus(code connect.Code) int {
	switch code {
	case connect.CodeInvalidArgument:
		return http.StatusBadRequest
	case connect.CodeFailedPrecondition:
		return http.StatusPreconditionFailed
	case connect.CodeOutOfRange:
		return http.StatusRequestedRangeNotSatisfiable
	case connect.CodeUnauthenticated:
		return http.StatusUnauthorized
	case connect.CodePermissionDenied:
		return http.StatusForbidden
	case connect.CodeNotFound:
		return http.StatusNotFound
	case connect.CodeAlreadyExists:
		return http.StatusUnprocessableEntity
	case connect.CodeCanceled:
		return http.StatusRequestTimeout
	case connect.CodeAborted:
		return http.StatusConflict
	case connect.CodeResourceExhausted:
		return http.StatusTooManyRequests
	case connect.CodeUnimplemented:
		return http.StatusNotImplemented
	case connect.CodeUnavailable:
		return http.StatusServiceUnavailable
	case connect.CodeDeadlineExceeded:
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError // Unknown, Internal, DataLoss, codes outside the list
}

// ErrorDomain is the domain of the google.rpc.ErrorInfo detail on idem's own
// answers (the same as idemgrpc's); its reason names the case, the problem
// type of the README's behaviour table in upper snake case.
const ErrorDomain = "idem.idemkit.github.com"

// problemError turns an answer of the engine that is not a replay into a
// Connect error with google.rpc details (the table in the package doc).
// keyName names the header the key travels in; keys are its values.
func problemError(resp *idem.Response, keyName string, keys []string) *connect.Error {
	var p idem.Problem
	_ = json.Unmarshal(resp.Body, &p) // a custom renderer's body: p stays empty
	slug, _ := strings.CutPrefix(p.Type, idem.ProblemTypeBase)
	var code connect.Code
	var msg string
	var details []proto.Message
	retry := false
	switch resp.Status {
	case http.StatusBadRequest:
		code, slug = connect.CodeInvalidArgument, "key-malformed"
		_, err := idem.ParseKey(keys)
		switch {
		case errors.Is(err, idem.ErrKeyMissing):
			slug, msg = "key-missing", "this procedure requires an "+keyName+" header: a unique value, e.g. a UUID, sent again unchanged with every retry"
		case err != nil:
			msg = keyName + " header malformed: " + err.Error()
		case p.Detail != "":
			msg = p.Detail // refused by the engine's key validator
		default:
			msg = keyName + " header refused"
		}
		details = append(details, &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: keyName, Description: msg}}})
	case http.StatusUnauthorized:
		code, slug, msg = connect.CodeUnauthenticated, "no-principal", "idempotency keys are scoped to the authenticated caller; this call has none"
	case http.StatusConflict:
		code, slug, msg, retry = connect.CodeAborted, "in-progress", "a call with this idempotency key is in progress; retry after the RetryInfo delay to get its result", true
	case http.StatusUnprocessableEntity:
		code, slug, msg = connect.CodeFailedPrecondition, "key-reused", "this idempotency key was already used with a different request (procedure or message); use a new key for a new request"
		details = append(details, &errdetails.PreconditionFailure{Violations: []*errdetails.PreconditionFailure_Violation{{Type: "IDEMPOTENCY_KEY", Subject: keyName, Description: msg}}})
	case http.StatusRequestEntityTooLarge:
		code, slug, msg = connect.CodeResourceExhausted, "body-too-large", "the request message is larger than this service accepts for idempotent calls; nothing was executed"
	case http.StatusGone:
		code, slug, msg = connect.CodeFailedPrecondition, "response-not-stored", "the call with this idempotency key was executed once, but its response was too large to store and cannot be replayed"
	case http.StatusServiceUnavailable:
		code, slug, msg, retry = connect.CodeUnavailable, "store-unavailable", "the idempotency store could not be reached, so the call was not executed; it is safe to retry with the same key", true
	case http.StatusInternalServerError:
		code, slug, msg = connect.CodeInternal, "stored-result-unreadable", "the call with this idempotency key was recorded, but its stored result cannot be read; retrying will not help until the operator clears the record"
	default:
		code, msg = connect.CodeUnknown, p.Detail
	}
	info := &errdetails.ErrorInfo{Domain: ErrorDomain, Reason: strings.ToUpper(strings.ReplaceAll(slug, "-", "_"))}
	if p.OriginalStatus != 0 {
		info.Metadata = map[string]string{"original_status": strconv.Itoa(p.OriginalStatus)}
	}
	ce := connect.NewError(code, errors.New(msg))
	if retry {
		d := retryAfter(resp)
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(d)})
		ce.Meta().Set("Retry-After", strconv.Itoa(int(d/time.Second)))
	}
	for _, m := range append([]proto.Message{info}, details...) {
		if d, err := connect.NewErrorDetail(m); err == nil {
			ce.AddDetail(d)
		}
	}
	return ce
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
