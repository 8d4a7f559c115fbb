package idemmcp

import (
	"encoding/json"
	"errors"

	idem "github.com/idemkit/idem/core"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// The values of [ErrorData.Type]: one per answer of the middleware that is
// not the tool's own result. The two SEP-3182 names
// (idempotency_key_in_progress, idempotency_key_conflict) are the
// proposal's; the others follow their pattern.
const (
	// TypeKeyMissing: a mutating tool called without a key (and without
	// [WithKeyOptional]). Nothing ran. Code -32602.
	TypeKeyMissing = "idempotency_key_missing"
	// TypeKeyMalformed: the key is not a string of 1 to 255 bytes. Nothing
	// ran. Code -32602.
	TypeKeyMalformed = "idempotency_key_malformed"
	// TypeNoPrincipal: the call has no principal to scope the key by (no
	// TokenInfo UserID, no [WithScope] result) and the engine has no
	// idem.WithGlobalScope. Nothing ran. Code -32603.
	TypeNoPrincipal = "idempotency_no_principal"
	// TypeInProgress: a call with this key is still executing. Nothing ran
	// for this one; retry after RetryAfterSeconds with the same key to get
	// its result (SEP-3182: reject, never run twice, never block). Code
	// -32603, Retryable.
	TypeInProgress = "idempotency_key_in_progress"
	// TypeConflict: the key was used before with other arguments or for
	// this tool under another fingerprint (SEP-3182 "key reused"); nothing
	// ran. Use a new key for a new call. Code -32602.
	TypeConflict = "idempotency_key_conflict"
	// TypeUncertain: the call with this key started in a process that
	// crashed before recording its outcome (idem.WithUncertainAfterCrash):
	// it may or may not have taken effect. Do not retry automatically; an
	// operator resolves it (idemctl). Code -32603.
	TypeUncertain = "idempotency_outcome_uncertain"
	// TypeKeyExpired: the key was used and its result is no longer stored,
	// only its tombstone (idem.WithTombstones). Do not retry with this key.
	// Code -32603.
	TypeKeyExpired = "idempotency_key_expired"
	// TypeResultNotStored: the call ran once but its result was larger than
	// idem.WithMaxResponseBytes, so it cannot be replayed. Do not retry.
	// Code -32603.
	TypeResultNotStored = "idempotency_result_not_stored"
	// TypeStoreUnavailable: the idempotency store could not be reached, so
	// the tool did not run (or its transactional writes were rolled back).
	// Retryable with the same key. Code -32603.
	TypeStoreUnavailable = "idempotency_store_unavailable"
	// TypeRecordUnreadable: the key's record cannot be decoded; retrying
	// does not help until an operator clears it. Code -32603.
	TypeRecordUnreadable = "idempotency_record_unreadable"
)

// retryAfterSeconds is the delay a retryable answer suggests: the engine's
// default idem.WithRetryAfter (1 s); idem.Do reports no lease time left.
const retryAfterSeconds = 1

// ErrorData is the data member of the JSON-RPC errors the middleware
// answers with, the structured value SEP-3182 asks for in error.data.
type ErrorData struct {
	// Type names the case: one of the Type constants.
	Type string `json:"type"`
	// IdempotencyKey echoes the call's key, when it had one (keys are not
	// secrets: SEP-3182, "Security Implications").
	IdempotencyKey string `json:"idempotencyKey,omitempty"`
	// Retryable reports whether sending the same call again with the same
	// key may succeed (in progress, store unavailable).
	Retryable bool `json:"retryable"`
	// RetryAfterSeconds is the suggested delay before that retry, 0 when
	// not retryable.
	RetryAfterSeconds int `json:"retryAfterSeconds,omitempty"`
}

// ErrorDataOf returns the [ErrorData] of err when err is, or wraps, a
// JSON-RPC error from this middleware (as (*mcp.ClientSession).CallTool
// returns it); ok is false for every other error.
func ErrorDataOf(err error) (d ErrorData, ok bool) {
	var we *jsonrpc.Error
	if !errors.As(err, &we) || len(we.Data) == 0 {
		return ErrorData{}, false
	}
	if json.Unmarshal(we.Data, &d) != nil || d.Type == "" {
		return ErrorData{}, false
	}
	return d, true
}

// newError returns the JSON-RPC error of one refusal.
func newError(typ, key, msg string) *jsonrpc.Error {
	d := ErrorData{Type: typ, IdempotencyKey: key}
	code := int64(jsonrpc.CodeInternalError)
	switch typ {
	case TypeKeyMissing, TypeKeyMalformed, TypeConflict:
		code = jsonrpc.CodeInvalidParams
	case TypeInProgress, TypeStoreUnavailable:
		d.Retryable, d.RetryAfterSeconds = true, retryAfterSeconds
	}
	data, _ := json.Marshal(d) // plain fields: cannot fail
	return &jsonrpc.Error{Code: code, Message: msg, Data: data}
}

// answer maps an error of [idem.Do] that did not run the tool.
func answer(err error, key string) *jsonrpc.Error {
	switch {
	case errors.Is(err, idem.ErrInProgress):
		return newError(TypeInProgress, key, "a call with this idempotency key is in progress; nothing was executed for this one: retry in a second with the same key to get its result")
	case errors.Is(err, idem.ErrMismatch):
		return newError(TypeConflict, key, "this idempotency key was already used with different arguments; nothing was executed: use a new key for a new call")
	case errors.Is(err, idem.ErrUncertain):
		return newError(TypeUncertain, key, "the call with this idempotency key started in a process that stopped before recording its outcome: it may or may not have taken effect; do not retry automatically, an operator must resolve it")
	case errors.Is(err, idem.ErrKeyExpired):
		return newError(TypeKeyExpired, key, "this idempotency key was used and its result is no longer kept; nothing was executed: do not retry with this key")
	case errors.Is(err, idem.ErrResultNotStored):
		return newError(TypeResultNotStored, key, "the call with this idempotency key was executed once, but its result was too large to store and cannot be replayed; do not retry")
	case errors.Is(err, idem.ErrUnavailable):
		return newError(TypeStoreUnavailable, key, "the idempotency store could not be reached, so the call was not executed; it is safe to retry with the same key")
	case errors.Is(err, idem.ErrKeyMalformed), errors.Is(err, idem.ErrKeyTooLong):
		return newError(TypeKeyMalformed, key, err.Error())
	}
	// idem.ErrCorrupt (wrapped): the only other error Do returns without
	// running the function.
	return newError(TypeRecordUnreadable, key, "the call with this idempotency key was recorded, but its stored result cannot be read; retrying will not help until an operator clears the record: "+err.Error())
}
