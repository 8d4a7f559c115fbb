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
// answers; its reason names the outcome ([Reason]): the problem type of the
// README's behaviour table in upper snake case, e.g. IN_PROGRESS,
// OPERATION_UNCERTAIN.
const ErrorDomain = "idem.idemkit.github.com"

// Reason returns the google.rpc.ErrorInfo reason of outcome o: its problem
// type fragment in upper snake case ("operation-uncertain":
// OPERATION_UNCERTAIN); "" for idem.OutcomeNone.
func Reason(o idem.Outcome) string {
	return strings.ToUpper(strings.ReplaceAll(o.String(), "-", "_"))
}

// OutcomeOfReason returns the outcome whose [Reason] is reason, or
// idem.OutcomeNone.
func OutcomeOfReason(reason string) idem.Outcome {
	return idem.OutcomeOfType(idem.ProblemTypeBase + strings.ToLower(strings.ReplaceAll(reason, "_", "-")))
}

// Code returns the status code idem answers outcome o with on gRPC and
// Connect, chosen by the gRPC status code guide (google.rpc.Code: "use
// ABORTED if the client should retry at a higher level ... use
// FAILED_PRECONDITION if the client should not retry until the system
// state has been explicitly fixed"):
//
//	outcome                   code                reason                    details           client
//	in-progress               Aborted             IN_PROGRESS               RetryInfo         retries within its deadline
//	store-unavailable         Unavailable         STORE_UNAVAILABLE         RetryInfo         retries
//	operation-uncertain       FailedPrecondition  OPERATION_UNCERTAIN       PreconditionFailure  stops: an operator resolves the record
//	key-expired               FailedPrecondition  KEY_EXPIRED               PreconditionFailure  stops: use a new key for a new call
//	key-reused                FailedPrecondition  KEY_REUSED                PreconditionFailure  stops
//	fingerprint-changed       FailedPrecondition  FINGERPRINT_CHANGED       PreconditionFailure  stops
//	response-not-stored       FailedPrecondition  RESPONSE_NOT_STORED       ErrorInfo original_status  stops
//	replay-forbidden          PermissionDenied    REPLAY_FORBIDDEN          -                 stops
//	stored-result-unreadable  Internal            STORED_RESULT_UNREADABLE  -                 stops
//	key-missing, key-malformed  InvalidArgument   KEY_MISSING, KEY_MALFORMED  BadRequest      stops
//	body-unreadable           InvalidArgument     BODY_UNREADABLE           -                 stops
//	no-principal              Unauthenticated     NO_PRINCIPAL              -                 stops
//	body-too-large            ResourceExhausted   BODY_TOO_LARGE            -                 stops
//
// operation-uncertain is FailedPrecondition, not Aborted: Aborted tells a
// client to retry the sequence, and gRPC clients (idem's among them) retry
// Aborted with RetryInfo, while an uncertain outcome must not be retried
// until an operator has fixed the record. Unknown for idem.OutcomeNone.
func Code(o idem.Outcome) uint32 {
	switch o {
	case idem.OutcomeInProgress:
		return Aborted
	case idem.OutcomeUnavailable:
		return Unavailable
	case idem.OutcomeUncertain, idem.OutcomeKeyExpired, idem.OutcomeKeyReused, idem.OutcomeFingerprintChanged, idem.OutcomeResponseNotStored:
		return FailedPrecondition
	case idem.OutcomeReplayForbidden, idem.OutcomeRecoveryRefused:
		return PermissionDenied
	case idem.OutcomeUnreadable:
		return Internal
	case idem.OutcomeKeyMissing, idem.OutcomeKeyMalformed, idem.OutcomeBodyUnreadable:
		return InvalidArgument
	case idem.OutcomeNoPrincipal:
		return Unauthenticated
	case idem.OutcomeBodyTooLarge:
		return ResourceExhausted
	}
	return Unknown
}

// Answer turns an answer of the engine that is not a replay (an RFC 9457
// problem, or the app's rendering of one) into a google.rpc.Status by its
// outcome ([idem.OutcomeOf]; codes, reasons and details in [Code]'s
// table): always an ErrorInfo{Domain: ErrorDomain, Reason: [Reason]}, then
// BadRequest (key missing or malformed), PreconditionFailure
// (FailedPrecondition outcomes) or RetryInfo (in progress, store
// unavailable: the answer's Retry-After). keyName names where the key
// travels ("idempotency-key"), keyKind what that is ("metadata",
// "header"); keys are its values in the request. retryAfter is the
// RetryInfo delay, 0 without one.
func Answer(resp *idem.Response, keyName, keyKind string, keys []string) (st *spb.Status, retryAfter time.Duration) {
	var p idem.Problem
	_ = json.Unmarshal(resp.Body, &p) // a custom renderer's body: p stays empty
	o := idem.OutcomeOf(resp)
	if o == idem.OutcomeNone && resp.IsReplay() && resp.Status == http.StatusGone {
		o = idem.OutcomeResponseNotStored // rendered by a custom renderer; an RPC outcome is never stored as 410
	}
	code := Code(o)
	var msg string
	var details []proto.Message
	switch o {
	case idem.OutcomeKeyMissing, idem.OutcomeKeyMalformed:
		_, err := idem.ParseKey(keys)
		switch {
		case errors.Is(err, idem.ErrKeyMissing):
			msg = "this method requires " + keyName + " " + keyKind + ": a unique value, e.g. a UUID, sent again unchanged with every retry"
		case err != nil:
			msg = keyName + " " + keyKind + " malformed: " + strings.TrimPrefix(err.Error(), "idem: ")
		case p.Detail != "":
			msg = p.Detail // refused by the engine's key validator
		default:
			msg = keyName + " " + keyKind + " refused"
		}
		details = append(details, &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: keyName, Description: msg}}})
	case idem.OutcomeNoPrincipal:
		msg = "idempotency keys are scoped to the authenticated caller; this call has none"
	case idem.OutcomeBodyUnreadable:
		msg = "the request message could not be read completely"
	case idem.OutcomeInProgress:
		msg, retryAfter = "a call with this idempotency key is in progress; retry after the RetryInfo delay to get its result", retryAfterOf(resp)
	case idem.OutcomeKeyReused:
		msg = "this idempotency key was already used with a different request (method or message); use a new key for a new request"
	case idem.OutcomeFingerprintChanged:
		msg = "a call with this idempotency key was recorded while this service compared requests another way, so it cannot tell whether this call is the same one; nothing was executed; use a new key for a new request"
	case idem.OutcomeUncertain:
		msg = "a call with this idempotency key started but its server stopped before recording the outcome, so it may or may not have taken effect; do not retry: the service operator must resolve it first"
	case idem.OutcomeKeyExpired:
		msg = "this idempotency key was used and its response is no longer stored; do not retry with it: check the outcome of the original call, and use a new key for a new call"
	case idem.OutcomeReplayForbidden:
		msg = "a call with this idempotency key was already made, and this caller is not allowed to see its outcome"
	case idem.OutcomeRecoveryRefused:
		msg = "this call carries an idem-recovery value that no pending recovery run issued; nothing was executed"
	case idem.OutcomeBodyTooLarge:
		msg = "the request message is larger than this service accepts for idempotent calls; nothing was executed"
	case idem.OutcomeResponseNotStored:
		msg = "the call with this idempotency key was executed once, but its response was too large to store and cannot be replayed"
	case idem.OutcomeUnavailable:
		msg, retryAfter = "the idempotency store could not be reached, so the call was not executed; it is safe to retry with the same key", retryAfterOf(resp)
	case idem.OutcomeUnreadable:
		msg = "the call with this idempotency key was recorded, but its stored result cannot be read; retrying will not help until the operator clears the record"
	default:
		msg = p.Detail
	}
	if code == FailedPrecondition && o != idem.OutcomeResponseNotStored {
		details = append(details, &errdetails.PreconditionFailure{Violations: []*errdetails.PreconditionFailure_Violation{{Type: "IDEMPOTENCY_KEY", Subject: keyName, Description: msg}}})
	}
	info := &errdetails.ErrorInfo{Domain: ErrorDomain, Reason: Reason(o)}
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
