package idem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
)

// Errors returned by [Do]. Besides them, Do returns fn's own error (a
// transient one after releasing the key, one marked [Permanent] after
// storing it), [ErrCorrupt] (wrapped) for a record the store cannot decode,
// and [ErrKeyMalformed] or [ErrKeyTooLong] for an unusable [Operation.Key].
var (
	// ErrInProgress: another execution holds the key's lease (the function
	// runs elsewhere, or ran in a process that crashed and whose lease has
	// not lapsed yet); with [WithWait], the wait ended first. Retry later.
	ErrInProgress = errors.New("idem: operation with this key is in progress")
	// ErrMismatch: the key was used before with another payload
	// ([Operation.Payload]); the function did not run. Not worth retrying.
	ErrMismatch = errors.New("idem: key reused with another payload")
	// ErrUnavailable wraps a store failure: the function did not run, or
	// ran inside a transaction of a [Transactional] store whose completion
	// failed and which was rolled back. Retry later.
	ErrUnavailable = errors.New("idem: store unavailable")
	// ErrPermanent matches every error marked with [Permanent], and the
	// [StoredError] a duplicate gets in its place.
	ErrPermanent = errors.New("idem: permanent failure")
	// ErrUncertain: the key's operation started in a process that crashed
	// before recording its outcome ([WithUncertainAfterCrash]): it may or
	// may not have taken effect. The function did not run. Do not retry
	// automatically; an operator resolves the record (cmd/idemctl).
	ErrUncertain = errors.New("idem: operation with this key has an uncertain outcome")
	// ErrKeyExpired: the key was used and its result is no longer stored,
	// only its tombstone ([WithTombstones]); the function did not run. Do
	// not retry with this key.
	ErrKeyExpired = errors.New("idem: key used and its result expired")
	// ErrResultNotStored: the operation ran once but its encoded result was
	// larger than [WithMaxResponseBytes], so duplicates cannot have it.
	ErrResultNotStored = errors.New("idem: operation completed but its result was too large to store")
)

// doMethod stands for the HTTP method in the scoped key of an [Operation]:
// it is not an RFC 9110 token, so no HTTP request covered by an engine
// ([WithMethods] takes tokens only) shares a record with an operation.
const doMethod = "(do)"

// Statuses under which [Do] stores its outcomes, in the engine's status
// policy: a result is stored as 200, a permanent error as 422.
const (
	doStatusResult    = http.StatusOK
	doStatusPermanent = http.StatusUnprocessableEntity
)

// Operation names one exactly-once unit of work for [Do]. The record key
// is [ScopedKey](Scope, "(do)", Name, Key): the method "(do)" is not an
// HTTP method token, so operations never share records with HTTP requests
// of the same engine, and two operations, or two scopes, never share a
// record either.
type Operation struct {
	// Scope is who or what the key belongs to: a tenant, an account, a
	// stream or queue name. Optional (the key is then shared across
	// scopes); keys taken from messages should be scoped by their source.
	Scope string
	// Name names the operation, e.g. "send-receipt". Required.
	Name string
	// Key is the idempotency key: a message id, a job id, a key derived from
	// the payload. Required, 1 to [MaxKeyLength] bytes, any bytes.
	Key string
	// Payload is fingerprinted: the same key with another payload gets
	// [ErrMismatch] (IETF draft section 2.7 for HTTP; AWS Powertools'
	// payload validation). nil or empty matches only nil or empty.
	Payload []byte
	// Codec encodes the result for duplicates. Optional. Default is
	// [JSONCodec].
	Codec Codec
	// Recover keeps Scope, Name, Key and Payload in the record from the
	// acquire on (one [Recoverable.SetRecovery] before fn runs; its
	// failure releases the key and Do returns [ErrUnavailable]), so that
	// a [Recoverer] runs the operation again through the function
	// registered for Name ([Recoverer.Handle]) when its holder stopped and
	// nobody calls Do again. Scope, Name, Key, Payload and Input must fit
	// [MaxRecoveryBytes] together, else Do returns an error wrapping
	// [ErrTooLarge] without running fn. The engine's store must implement
	// [Recoverable] and [Journal] and the engine must not use
	// [WithUncertainAfterCrash], else Do returns [ErrNoRecovery]. Optional.
	// Default is false.
	Recover bool
	// Input is kept with the recovery payload (Recover) and handed back
	// to the recovery function ([Recoverer.Handle]) as the operation's
	// Input, but not fingerprinted: what the function needs to run again
	// when Payload is only a digest of it (idemmcp keeps a tool call's
	// arguments here). It counts toward [MaxRecoveryBytes]. Optional.
	Input []byte
}

// ErrNoRecovery is returned by [Do] for an [Operation] with Recover set on
// an engine that cannot recover it: its store does not implement
// [Recoverable] and [Journal], or the engine uses [WithUncertainAfterCrash].
// fn did not run.
var ErrNoRecovery = errors.New("idem: Operation.Recover needs a store that implements idem.Recoverable and idem.Journal, without WithUncertainAfterCrash")

// Codec encodes a function's result to bytes for the store and decodes it
// for duplicates ([Operation.Codec]).
type Codec interface {
	// Marshal returns the encoding of v, a value of the function's result type.
	Marshal(v any) ([]byte, error)
	// Unmarshal decodes data into v, a pointer to the result type.
	Unmarshal(data []byte, v any) error
}

// JSONCodec encodes results with encoding/json: only exported fields
// survive, and a duplicate's result is what json.Unmarshal makes of them.
var JSONCodec Codec = jsonCodec{}

// BytesCodec stores results of type []byte or string as they are.
// Marshal of any other type returns an error.
var BytesCodec Codec = bytesCodec{}

type jsonCodec struct{}

func (jsonCodec) Marshal(v any) ([]byte, error)      { return json.Marshal(v) }
func (jsonCodec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }

type bytesCodec struct{}

func (bytesCodec) Marshal(v any) ([]byte, error) {
	switch v := v.(type) {
	case []byte:
		return v, nil
	case string:
		return []byte(v), nil
	}
	return nil, fmt.Errorf("idem: BytesCodec cannot encode %T", v)
}

func (bytesCodec) Unmarshal(data []byte, v any) error {
	switch v := v.(type) {
	case *[]byte:
		*v = append([]byte(nil), data...)
	case *string:
		*v = string(data)
	default:
		return fmt.Errorf("idem: BytesCodec cannot decode into %T", v)
	}
	return nil
}

// Permanent marks err as a permanent failure of the operation: [Do] stores
// it (as the engine's status policy stores a 422) and returns it; a
// duplicate then gets a [StoredError] with its message instead of running
// the function again, so that a message that can never succeed is not
// retried forever. Both match [ErrPermanent] with errors.Is. Permanent(nil)
// is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

type permanentError struct{ err error }

func (p *permanentError) Error() string        { return p.err.Error() }
func (p *permanentError) Unwrap() error        { return p.err }
func (p *permanentError) Is(target error) bool { return target == ErrPermanent }

// StoredError is what a duplicate gets from [Do] when the first execution
// failed with a [Permanent] error: its message, as stored. It matches
// [ErrPermanent], and another StoredError with the same Message, with
// errors.Is.
type StoredError struct {
	// Message is the permanent error's Error().
	Message string
}

// Error returns the stored message.
func (s *StoredError) Error() string { return s.Message }

// Is reports whether target is [ErrPermanent] or a *StoredError with the same Message.
func (s *StoredError) Is(target error) bool {
	if t, ok := target.(*StoredError); ok {
		return t.Message == s.Message
	}
	return target == ErrPermanent
}

// Do runs fn at most once per (op.Scope, op.Name, op.Key) while the record
// lasts (the engine's retention), with the engine's lease, renewal,
// takeover, store timeout, events and metrics: a job or message consumer's
// idempotency, where [Engine.Begin] is a request's.
//
//   - First call: fn runs with ctx carrying the execution ([InfoFromContext]
//     and, for a [Transactional] store, its Unit: pgstore.Tx(ctx) commits
//     fn's writes with the record). Its result is encoded with op.Codec and
//     stored; Do returns it once the record is completed (it waits for the
//     engine's completion retries, [WithCompletionRetry], or for ctx).
//   - Duplicate: fn does not run; Do returns the stored result, decoded
//     (or the [StoredError] of a permanent failure).
//   - Duplicate while another execution holds the lease: [ErrInProgress]
//     (with [WithWait], after waiting up to that long for a result).
//   - Same key, another op.Payload: [ErrMismatch].
//   - A crashed execution's key under [WithUncertainAfterCrash]:
//     [ErrUncertain]; a spent key under [WithTombstones]: [ErrKeyExpired].
//   - fn returns an error: the key is released (a retry runs fn again) and
//     Do returns the error, unless it is marked [Permanent]: then it is
//     stored too and duplicates get it as a [StoredError]. Once a [Step]
//     of fn finished, the key is not released but its lease lapses at
//     once, the journal kept: a retry runs fn again with the finished
//     steps replayed ([EventAbandoned]).
//   - fn panics: the key is released (as for an error) and the panic goes on.
//   - The store fails: an error wrapping [ErrUnavailable] and the store's
//     error; fn did not run. [WithFailOpen] does not apply to Do.
//
// When completing the record fails after fn returned: with a
// [Transactional] store the transaction was rolled back, so Do returns an
// error wrapping [ErrUnavailable] (or [ErrNotOwner] when the lease was
// lost) and a retry runs fn again; with other stores fn's effects are done,
// so Do returns its result, and the engine logs the failure (as it does for
// HTTP: the key stays in progress until its lease lapses).
//
// Do is for fn's effects what the engine is for a handler's: effects
// written through the execution's transaction happen exactly once, even
// across crashes; other effects happen at most once per lease (a process
// that stalls longer than the lease without renewing can be taken over).
func Do[T any](ctx context.Context, e *Engine, op Operation, fn func(ctx context.Context) (T, error)) (T, error) {
	var zero T
	if op.Name == "" {
		return zero, errors.New("idem: Do needs an operation name")
	}
	if err := checkKeyLength(op.Key); err != nil {
		return zero, err
	}
	codec := op.Codec
	if codec == nil {
		codec = JSONCodec
	}
	ev := Event{
		Key:    ScopedKey(op.Scope, doMethod, op.Name, op.Key),
		Method: doMethod, Route: op.Name,
	}
	fp := Fingerprint(doMethod, op.Name, "", "", op.Payload)
	if x, err := e.adoptOp(ctx, ev, ev.Key, fp); x != nil || err != nil {
		if err != nil {
			return zero, err
		}
		return run(ctx, x, codec, fn)
	}
	var payload []byte
	if op.Recover {
		if e.recoverable == nil || e.journal == nil || e.cfg.keep.Uncertain > 0 {
			return zero, ErrNoRecovery
		}
		payload = encodeRecovery(&recoveryRequest{Kind: recoveryOp, Method: op.Scope, Route: op.Name, Path: string(op.Input), Key: op.Key, Body: op.Payload})
		if len(payload) > MaxRecoveryBytes {
			return zero, fmt.Errorf("idem: operation %q: scope, key, input and payload larger than MaxRecoveryBytes: %w", op.Name, ErrTooLarge)
		}
	}
	token := e.tokenPrefix + strconv.FormatUint(e.tokens.Add(1), 36) // as ids makes them
	x, rec, err := e.begin(ctx, &ev, &e.cfg.policy, fp, token, nil)
	switch {
	case x != nil && payload != nil:
		if err := e.setRecovery(ctx, x, payload); err != nil {
			return zero, fmt.Errorf("%w: storing the recovery payload: %w", ErrUnavailable, err)
		}
		return run(ctx, x, codec, fn)
	case x != nil:
		return run(ctx, x, codec, fn)
	case errors.Is(err, errInProgress):
		ev.Kind = EventConflict
		e.emit(ctx, ev)
		return zero, ErrInProgress
	case errors.Is(err, errMismatch):
		ev.Kind = EventMismatch
		e.emit(ctx, ev)
		return zero, ErrMismatch
	case errors.Is(err, errUncertain):
		ev.Kind = EventUncertain
		e.reportUncertain(ctx, ev)
		e.emit(ctx, ev)
		return zero, ErrUncertain
	case errors.Is(err, errKeyExpired):
		ev.Kind = EventKeyExpired
		e.emit(ctx, ev)
		return zero, ErrKeyExpired
	case errors.Is(err, ErrCorrupt):
		return zero, err
	case err != nil:
		return zero, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	status, body, err := storedResult(rec)
	if err != nil {
		// err wraps ErrCorrupt
		e.reportUnreadable(ctx, ev, err)
		return zero, err
	}
	ev.Kind = EventReplayed
	e.emit(ctx, ev)
	switch status {
	case doStatusResult:
		var v T
		if err := codec.Unmarshal(body, &v); err != nil {
			return zero, fmt.Errorf("idem: decoding the stored result: %w", err)
		}
		return v, nil
	case doStatusPermanent:
		return zero, &StoredError{Message: string(body)}
	case http.StatusGone:
		return zero, ErrResultNotStored
	}
	return zero, fmt.Errorf("%w: operation record with HTTP status %d", ErrCorrupt, status)
}

// run runs fn in the execution x and ends x by fn's outcome.
func run[T any](ctx context.Context, x *Execution, codec Codec, fn func(context.Context) (T, error)) (T, error) {
	var zero T
	ended := false
	defer func() {
		if !ended { // fn panicked: release, and let the panic go on
			x.Fail()
		}
	}()
	v, err := fn(x.WithInfo(ctx))
	ended = true
	status := doStatusResult
	switch {
	case errors.Is(err, ErrPermanent):
		status = doStatusPermanent
		_, _ = x.Write([]byte(err.Error()))
	case err != nil:
		x.Fail()
		return zero, x.uncertainOr(err)
	default:
		b, merr := codec.Marshal(v)
		if merr != nil {
			x.Fail()
			return zero, fmt.Errorf("idem: encoding the result: %w", merr)
		}
		_, _ = x.Write(b)
	}
	if !x.e.cfg.storePolicy(status) { // the engine's policy: Finish releases
		x.Finish(status, nil)
		if err != nil {
			return zero, err
		}
		return v, nil
	}
	done := make(chan error, 1)
	x.reported = func(err error) { done <- err }
	x.Finish(status, nil)
	var cerr error
	select {
	case cerr = <-done:
	default: // completion retried in the background (WithCompletionRetry)
		select {
		case cerr = <-done:
		case <-ctx.Done():
			cerr = ctx.Err()
		}
	}
	switch {
	case x.suspending() != "": // a step's outcome is unknown: ended uncertain, whatever fn returned
		return zero, x.uncertainOr(err)
	case err != nil: // permanent: returned whether or not it was stored
		return zero, err
	case errors.Is(cerr, ErrUncertain): // a step's outcome is unknown: ended uncertain, not completed
		return zero, cerr
	case cerr == nil, errors.Is(cerr, ErrNotDurable), x.unit == nil:
		return v, nil
	case errors.Is(cerr, ErrNotOwner):
		return zero, fmt.Errorf("idem: the operation's transaction was rolled back: %w", cerr)
	}
	return zero, fmt.Errorf("%w: the operation's transaction was not committed: %w", ErrUnavailable, cerr)
}

// uncertainOr returns err when x has no step of unknown outcome, else
// an error matching [ErrStepUncertain] (fn's own error kept in the text):
// the execution ended uncertain whatever fn returned.
func (x *Execution) uncertainOr(err error) error {
	step := x.suspending()
	if step == "" || errors.Is(err, ErrUncertain) {
		return err
	}
	if err == nil {
		return fmt.Errorf("step %q: %w", step, ErrStepUncertain)
	}
	return fmt.Errorf("step %q: %w (the function returned: %w)", step, ErrStepUncertain, err)
}

// storedResult returns the status and body of a completed record, read in
// place from its encoding (no copy).
func storedResult(rec Record) (status int, body []byte, err error) {
	l, ok := scanEncoding(rec.Response)
	if !ok {
		return 0, nil, errCorrupt
	}
	return l.status, rec.Response[l.headerEnd:], nil
}
