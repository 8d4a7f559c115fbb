package idem

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
)

// Errors returned by [Step], besides fn's own error, [ErrTooManySteps]
// and [ErrNotOwner] (wrapped: this execution lost its lease, so it may
// not journal; its takeover decides).
var (
	// ErrStepUncertain: the step was started by an execution whose holder
	// stopped (crashed or stalled past its lease) before journaling its
	// outcome, and the step is not [Repeatable]: its effect may or may not
	// have happened. fn did not run. The execution ends uncertain instead of
	// completing or releasing ([StateUncertain]) whatever the handler
	// answers, until an operator resolves the key (cmd/idemctl) or the keep
	// ([WithUncertainAfterCrash], else the retention) ends: later retries
	// get 409 "operation-uncertain", [Do] returns it. The request that got
	// it is answered by idem with that problem too, whatever its handler
	// writes ([Execution.Override]), and later Steps of the execution
	// return it without running. errors.Is(err, [ErrUncertain]) is true.
	ErrStepUncertain = fmt.Errorf("%w: a step started before a crash has an unknown outcome", ErrUncertain)
	// ErrNoJournal: the step runs in an execution whose store does not
	// implement [Journal]; fn did not run.
	ErrNoJournal = errors.New("idem: Step needs a store that implements idem.Journal")
	// ErrStepTooLarge: fn ran, but its encoded result is larger than
	// [MaxStepBytes], so it cannot be journaled; the execution ends
	// uncertain as for [ErrStepUncertain].
	ErrStepTooLarge = errors.New("idem: step result larger than MaxStepBytes")
	// ErrStepName: the step name is empty, longer than [MaxStepName] or
	// has a byte other than ASCII letters, digits, '-', '_', ':' and '/',
	// or a step of that name is running in this execution already (steps
	// of one name run one at a time).
	ErrStepName = errors.New("idem: invalid or busy step name")
)

// StepOption configures one [Step].
type StepOption func(*stepConfig)

type stepConfig struct {
	codec      Codec
	repeatable bool
}

// Repeatable declares the step safe to run again when its outcome is
// unknown (its holder crashed mid-step): its downstream dedupes by the
// step's derived key ([StepKey]; a provider's Idempotency-Key, another idem
// service through idemclient) or its effect is harmless twice. A
// takeover then runs it again instead of ending the execution uncertain.
func Repeatable() StepOption { return func(c *stepConfig) { c.repeatable = true } }

// StepCodec sets the codec of the step's result. Default is [JSONCodec],
// as for [Do].
func StepCodec(c Codec) StepOption { return func(s *stepConfig) { s.codec = c } }

// Step runs fn once per execution key and step name, and journals its
// outcome in the execution's record ([Journal]), so that the execution's
// handler, run again after a takeover, gets the journaled result back
// without running fn: the first run's result (decoded as by [Do]), or
// its [Permanent] error as a [StoredError]. ctx is the context the
// handler was given (an HTTP adapter's request context, gRPC's, [Do]'s
// function's); fn gets one carrying the step's derived key ([DerivedKey]).
//
// Outcomes fn does not journal: a transient error (not [Permanent]) or a
// panic leaves the step started and not done, as "no effect, or one
// safe to repeat", and a later Step of the name in the same execution
// runs fn again. The execution usually fails then: with no step finished
// it releases its key (the journal goes with it) and the retry starts
// afresh; once a step finished, an end without an answer to store (an
// error, a 5xx, a panic, a store error starting the next step) keeps the
// journal and lets the lease lapse at once ([EventAbandoned]), so the
// retry takes the record over and replays the finished steps (a step
// left started, not Repeatable, then ends it uncertain, as below; under
// [WithUncertainAfterCrash] the lapsed record turns uncertain, as after a
// crash). A step found started by an earlier holder that
// stopped has an unknown outcome: fn runs again if the step is
// [Repeatable], else Step returns [ErrStepUncertain] and the execution
// ends uncertain. When fn ran but its outcome cannot be journaled (store
// error, [ErrStepTooLarge]) the execution ends uncertain too.
//
// Outside an execution (no idempotency key under [WithKeyOptional], a
// method the engine does not cover, fail-open, or no idem at all) Step runs
// fn as it is, journaling nothing. Each Step costs two store round trips
// (start and finish) on a fresh run and one on a journaled one; [MaxSteps]
// steps per record, [MaxStepBytes] per result.
func Step[T any](ctx context.Context, name string, fn func(ctx context.Context) (T, error), opts ...StepOption) (T, error) {
	var zero T
	if !validStepName(name) {
		return zero, fmt.Errorf("%w: %q", ErrStepName, name)
	}
	x := executionOf(ctx)
	if x == nil {
		return fn(ctx)
	}
	cfg := stepConfig{codec: JSONCodec}
	for _, o := range opts {
		o(&cfg)
	}
	j := x.e.journal
	if j == nil {
		return zero, ErrNoJournal
	}
	if earlier := x.suspending(); earlier != "" { // nothing runs after a step whose outcome is unknown
		return zero, fmt.Errorf("step %q after step %q: %w", name, earlier, ErrStepUncertain)
	}
	if !x.claimStep(name) {
		return zero, fmt.Errorf("%w: step %q is running in this execution", ErrStepName, name)
	}
	defer x.unclaimStep(name)
	var entry StepEntry
	err := x.stepCall(func(c context.Context) (err error) {
		entry, err = j.StartStep(c, x.ev.Key, x.token, name, x.pol.retention)
		return err
	})
	switch {
	case errors.Is(err, ErrNotOwner):
		return zero, fmt.Errorf("idem: step %q: this execution's lease is lost: %w", name, err)
	case errors.Is(err, ErrTooManySteps):
		return zero, err
	case err != nil:
		return zero, fmt.Errorf("%w: starting step %q: %w", ErrUnavailable, name, err)
	case entry.Done:
		x.markJournaled() // an end without an answer keeps the journal (unstored)
		return decodeStep[T](entry.Result, cfg.codec)
	case entry.Token != x.token && !cfg.repeatable:
		x.suspendAtEnd(name)
		return zero, fmt.Errorf("step %q: %w", name, ErrStepUncertain)
	}
	v, ferr := fn(context.WithValue(ctx, stepKeyCtx{}, x.stepKey(name)))
	if ferr != nil && !errors.Is(ferr, ErrPermanent) {
		return zero, ferr
	}
	result, err := encodeStep(v, ferr, cfg.codec)
	if err == nil && len(result) > MaxStepBytes {
		err = ErrStepTooLarge
	}
	if err != nil { // fn's effect happened, its outcome can't be journaled
		x.suspendAtEnd(name)
		return zero, fmt.Errorf("idem: step %q: %w", name, err)
	}
	finish := func(c context.Context) error { return j.FinishStep(c, x.ev.Key, x.token, name, result) }
	if err = x.stepCall(finish); err != nil && !errors.Is(err, ErrNotOwner) {
		err = x.stepCall(finish) // a blip: FinishStep is idempotent
	}
	if err != nil {
		x.suspendAtEnd(name) // a takeover finds the step started: uncertain unless repeatable
		return zero, fmt.Errorf("%w: journaling step %q: %w", ErrUnavailable, name, err)
	}
	x.markJournaled()
	return v, ferr
}

// stepCall runs one journal call with the engine's store timeout.
func (x *Execution) stepCall(call func(ctx context.Context) error) error {
	if x.e.local {
		return call(x.ctx)
	}
	ctx, cancel := x.e.storeCall(x.ctx)
	defer cancel()
	return call(ctx)
}

// Step results in a journal: a tag byte, then the codec's bytes ('v') or
// the permanent error's message ('e').
const (
	stepValue = 'v'
	stepError = 'e'
)

func encodeStep[T any](v T, ferr error, codec Codec) ([]byte, error) {
	if ferr != nil {
		return append([]byte{stepError}, ferr.Error()...), nil
	}
	b, err := codec.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encoding the result: %w", err)
	}
	return append([]byte{stepValue}, b...), nil
}

func decodeStep[T any](b []byte, codec Codec) (T, error) {
	var v T
	switch {
	case len(b) > 0 && b[0] == stepError:
		return v, &StoredError{Message: string(b[1:])}
	case len(b) > 0 && b[0] == stepValue:
		if err := codec.Unmarshal(b[1:], &v); err != nil {
			return v, fmt.Errorf("idem: decoding a journaled step result: %w", err)
		}
		return v, nil
	}
	return v, fmt.Errorf("%w: journaled step result", ErrCorrupt)
}

func validStepName(name string) bool {
	if name == "" || len(name) > MaxStepName {
		return false
	}
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '_', c == ':', c == '/':
		default:
			return false
		}
	}
	return true
}

type stepKeyCtx struct{}

// StepKey returns the derived idempotency key of step name of the
// execution ctx belongs to: "idem-" and 64 lowercase hex characters (69
// bytes; Stripe accepts up to 255), the same for every run and takeover of
// the execution, distinct across principals, routes, keys and step names
// (a SHA-256 of the scoped key and the name). Forward it as the
// Idempotency-Key of the step's downstream call. ok is false outside an
// execution, or for an invalid name.
func StepKey(ctx context.Context, name string) (key string, ok bool) {
	x := executionOf(ctx)
	if x == nil || !validStepName(name) {
		return "", false
	}
	return x.stepKey(name), true
}

// DerivedKey returns the derived key ([StepKey]) of the step whose fn ctx
// is given to, ok = false outside a step. idemclient's
// WithKeyFromContext and the gRPC and Connect client interceptors'
// options of that name use it, so that a call made inside a step carries
// a key stable across takeovers.
func DerivedKey(ctx context.Context) (key string, ok bool) {
	key, ok = ctx.Value(stepKeyCtx{}).(string)
	return key, ok
}

func (x *Execution) stepKey(name string) string {
	var stack [256]byte
	b := appendField(stack[:0], "idem-step")
	b = appendField(b, x.ev.Key)
	b = appendField(b, name)
	sum := sha256.Sum256(b)
	return "idem-" + hexSum(sum)
}

// executionOf returns the execution whose handler ctx belongs to, nil
// outside one.
func executionOf(ctx context.Context) *Execution {
	if p, ok := ctx.Value(infoKey{}).(*Info); ok {
		return p.exec
	}
	return nil
}

// claimStep marks step name running in x, false when it already is.
func (x *Execution) claimStep(name string) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	if _, busy := x.steps[name]; busy {
		return false
	}
	if x.steps == nil {
		x.steps = map[string]struct{}{}
	}
	x.steps[name] = struct{}{}
	return true
}

func (x *Execution) unclaimStep(name string) {
	x.mu.Lock()
	delete(x.steps, name)
	x.mu.Unlock()
}

// suspendAtEnd makes x end uncertain ([Journal.Suspend]) instead of
// completing or releasing, because step name's outcome is unknown.
func (x *Execution) suspendAtEnd(name string) {
	x.mu.Lock()
	if x.suspendStep == "" {
		x.suspendStep = name
	}
	x.mu.Unlock()
}

// suspending reports the step that makes x end uncertain, "" for none.
func (x *Execution) suspending() string {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.suspendStep
}

// suspend ends x uncertain: the record keeps its journal and answers 409
// "operation-uncertain" until an operator resolves it or the keep
// ([WithUncertainAfterCrash], else the retention) ends.
func (x *Execution) suspend(step string) {
	keep := x.e.cfg.keep.Uncertain
	if keep <= 0 {
		keep = x.pol.retention
	}
	start := x.e.clock()
	ctx := x.ctx
	cancel := func() {}
	if !x.e.local {
		ctx, cancel = x.e.storeCall(x.ctx)
	}
	var err error
	if su, ok := x.unit.(SuspendUnit); ok {
		err = su.Suspend(ctx, keep)
	} else {
		err = x.e.journal.Suspend(ctx, x.ev.Key, x.token, keep)
	}
	cancel()
	ev := x.ended(x.ev, OpSuspend, x.e.clock().Sub(start))
	switch {
	case errors.Is(err, ErrNotOwner):
		x.e.emitErr(x.ctx, ev, EventLeaseLost, err, "idem: lease lost before the execution could be made uncertain")
	case err != nil:
		x.e.emitErr(x.ctx, ev, EventStoreError, err, "idem: suspending an execution with an uncertain step failed; the key stays in progress until its lease lapses")
	default:
		ev.Kind = EventUncertain
		x.e.firstReport(suspendedName(x.token)) // a takeover from it follows an operator's resolve (reportTakeover)
		x.e.cfg.logger.WarnContext(x.ctx, "idem: a step's outcome is unknown (started before a crash, or not journaled); the key is uncertain until an operator resolves it with idemctl (README: Durable steps)",
			"key", x.ev.Key, "step", step, "method", x.ev.Method, "route", x.ev.Route)
		x.e.emit(x.ctx, ev)
	}
	x.tell(ErrStepUncertain)
	if x.reported != nil {
		x.reported(fmt.Errorf("step %q: %w", step, ErrStepUncertain))
	}
}
