package idemmcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"

	idem "github.com/idemkit/idem/core"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// MetaKey is the name, in a tools/call request's _meta, of the idempotency
// key: the name SEP-3182 gives its proposed params field (see the package
// doc for why the key travels in _meta here).
const MetaKey = "idempotencyKey"

// ReplayedMetaKey is the name, in a replayed CallToolResult's _meta, of a
// true value marking the result as the stored result of an earlier
// execution (what the Idempotent-Replayed header is over HTTP). Results of
// the execution itself never carry it.
const ReplayedMetaKey = "io.github.idemkit/replayed"

// OperationPrefix is put in front of a tool's name to name its operation
// for [idem.Do] ("tools/call:create_payment"): the record key is
// idem.ScopedKey(principal, "(do)", OperationPrefix+tool, key), and events
// carry it as their Route.
const OperationPrefix = "tools/call:"

// fingerprinter is core's canonical JSON comparison (RFC 8259 values:
// member order, whitespace and string escapes don't count).
var fingerprinter = idem.JSONFingerprint()

// Option configures the server middleware.
type Option func(*config)

type config struct {
	tools       map[string]bool
	recover     map[string]bool // WithRecovery's tools
	recoverer   *idem.Recoverer // WithRecovery's
	server      *mcp.Server     // WithRecovery's
	scope       func(ctx context.Context, req *mcp.CallToolRequest) string
	argument    string
	keyOptional bool
	release     bool
}

// WithTools adds the tools among ts whose annotations do not say they are
// safe to repeat: every tool except those with ReadOnlyHint or
// IdempotentHint set (MCP's defaults for a tool without annotations: not
// read-only, not idempotent). Pass the same *mcp.Tool values given to
// mcp.AddTool. Annotations are hints a server sets for its own tools; the
// middleware trusts them because they come from the server, never from
// the client.
func WithTools(ts ...*mcp.Tool) Option {
	return func(c *config) {
		for _, t := range ts {
			if a := t.Annotations; a == nil || !a.ReadOnlyHint && !a.IdempotentHint {
				c.tools[t.Name] = true
			}
		}
	}
}

// WithToolNames adds tools by name, whatever their annotations say.
func WithToolNames(names ...string) Option {
	return func(c *config) {
		for _, n := range names {
			c.tools[n] = true
		}
	}
}

// WithScope sets the function returning the principal of a call (user,
// account or API client id) when the request carries no
// auth.TokenInfo with a UserID (set by auth.RequireBearerToken on the
// streamable HTTP transport): for stdio servers, or principals taken from
// elsewhere. Optional. Without a principal a call is refused
// ([TypeNoPrincipal]) unless the engine has idem.WithGlobalScope.
func WithScope(fn func(ctx context.Context, req *mcp.CallToolRequest) string) Option {
	return func(c *config) { c.scope = fn }
}

// WithKeyArgument names a top-level member of the tool's arguments object
// that carries the idempotency key when _meta has none (for agents whose
// runtime cannot set _meta: the tool's input schema then declares it). The
// argument stays in the arguments the tool sees and the fingerprint covers.
// Optional. Default is none: the key comes from _meta only.
func WithKeyArgument(name string) Option { return func(c *config) { c.argument = name } }

// WithKeyOptional lets a call of a mutating tool without a key run
// unprotected (every such call executes). Optional. Default is to refuse
// it ([TypeKeyMissing]): an agent runtime that does not send keys would
// otherwise retry fund-moving calls unguarded without anyone noticing.
func WithKeyOptional() Option { return func(c *config) { c.keyOptional = true } }

// WithReleaseToolErrors makes a result with IsError release the key
// instead of being stored: a retry with the same key runs the tool again.
// For tools that report transient failures (an upstream timeout) as
// IsError results. Optional. Default is to store and replay them, as
// SEP-3182 and Stripe do: a caller that lost the answer must learn the
// outcome, not cause a second attempt; a new attempt takes a new key.
func WithReleaseToolErrors() Option { return func(c *config) { c.release = true } }

// Middleware returns a receiving middleware for
// (*mcp.Server).AddReceivingMiddleware that runs each tools/call of a
// mutating tool ([WithTools], [WithToolNames]) at most once per
// (principal, tool, idempotency key) with [idem.Do]: the engine's lease,
// renewal, retention, store timeout and events apply. Other methods and
// other tools pass through untouched.
//
//   - The key comes from _meta[MetaKey], else from the [WithKeyArgument]
//     argument: a JSON string of 1 to 255 bytes.
//   - The principal is the auth.TokenInfo UserID of the request, else what
//     the [WithScope] function returns.
//   - The fingerprint is the tool name and the canonical JSON of the
//     arguments (core's [idem.JSONFingerprint]: member order, whitespace and
//     string escapes don't count; numbers compare as written).
//   - First call: the tool runs (its context carries [idem.InfoFromContext]);
//     its CallToolResult is stored, including one with IsError (see
//     [WithReleaseToolErrors]). A JSON-RPC error from the handler, a panic,
//     or an input-required result (a multi round-trip request) releases
//     the key: nothing final was produced.
//   - Duplicate: the stored result, with _meta[ReplayedMetaKey] = true.
//   - Duplicate while the first runs, key reused with other arguments, and
//     every other refusal: a JSON-RPC error whose data is an [ErrorData]
//     (see the package doc's table).
//
// It panics when no tool is named: a middleware guarding nothing is a
// wiring mistake.
func Middleware(e *idem.Engine, opts ...Option) mcp.Middleware {
	c := config{tools: map[string]bool{}}
	for _, o := range opts {
		o(&c)
	}
	if len(c.tools) == 0 {
		panic("idemmcp: Middleware without mutating tools: pass idemmcp.WithTools(tools...) or idemmcp.WithToolNames(names...)")
	}
	global := globalScope(e)
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		c.handleRecovery(e, global, next)
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			call, ok := req.(*mcp.CallToolRequest)
			if method != "tools/call" || !ok || call.Params == nil || !c.tools[call.Params.Name] {
				return next(ctx, method, req)
			}
			return c.serve(ctx, e, global, next, call)
		}
	}
}

// errReleased is returned by the operation's function for an outcome that
// must not be stored; the middleware then answers with the outcome itself.
var errReleased = errors.New("idemmcp: outcome not stored")

// serve runs one call of a mutating tool under its idempotency key.
func (c *config) serve(ctx context.Context, e *idem.Engine, global bool, next mcp.MethodHandler, call *mcp.CallToolRequest) (mcp.Result, error) {
	p := call.Params
	key, err := c.key(p)
	switch {
	case err != nil:
		return nil, newError(TypeKeyMalformed, "", err.Error())
	case key == "" && c.keyOptional:
		return next(ctx, "tools/call", call)
	case key == "":
		return nil, newError(TypeKeyMissing, "", c.missingMessage(p.Name))
	}
	principal, recovering := ctx.Value(recoveringKey{}).(string) // a recovery run: the stored principal
	if x := call.GetExtra(); !recovering && x != nil && x.TokenInfo != nil {
		principal = x.TokenInfo.UserID
	}
	if principal == "" && !recovering && c.scope != nil {
		principal = c.scope(ctx, call)
	}
	if principal == "" && !global {
		return nil, newError(TypeNoPrincipal, key, "idempotency keys are scoped to the authenticated caller and this call has none; nothing was executed")
	}
	args := []byte(p.Arguments)
	if len(args) == 0 {
		args = []byte("{}") // what the go-sdk client sends for no arguments
	}
	op := idem.Operation{
		Scope: principal, Name: OperationPrefix + p.Name, Key: key,
		Payload: []byte(fingerprinter.Fingerprint("tools/call", p.Name, "", "application/json", args)),
		Codec:   idem.BytesCodec,
	}
	if c.recover[p.Name] {
		op.Recover, op.Input = true, args // what the recoverer calls the tool with again
	}
	var (
		ran   bool
		res   mcp.Result
		hErr  error
		first *mcp.CallToolResult
	)
	body, err := idem.Do(ctx, e, op, func(ctx context.Context) ([]byte, error) {
		ran = true
		res, hErr = next(ctx, "tools/call", call)
		if hErr != nil {
			return nil, errReleased
		}
		first, _ = res.(*mcp.CallToolResult)
		switch {
		case first == nil, len(first.InputRequests) > 0, first.RequestState != "", first.IsError && c.release:
			return nil, errReleased
		}
		b, err := json.Marshal(first)
		if err != nil {
			return nil, errReleased
		}
		return b, nil
	})
	switch {
	case ran && (err == nil || errors.Is(err, errReleased)):
		return res, hErr
	case ran:
		// A transactional store rolled the tool's writes back with the
		// record (ErrUnavailable, or ErrNotOwner after a lost lease).
		return nil, newError(TypeStoreUnavailable, key, "the call ran but its idempotency record was not committed, so its transactional writes were rolled back; it is safe to retry with the same key")
	case err != nil:
		return nil, answer(err, key)
	}
	var out mcp.CallToolResult
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, newError(TypeRecordUnreadable, key, "the call with this idempotency key was recorded, but its stored result cannot be read: "+err.Error())
	}
	out.Meta = maps.Clone(out.Meta)
	if out.Meta == nil {
		out.Meta = mcp.Meta{}
	}
	out.Meta[ReplayedMetaKey] = true
	return &out, nil
}

// key returns the call's idempotency key, "" when it carries none.
func (c *config) key(p *mcp.CallToolParamsRaw) (string, error) {
	if v, ok := p.Meta[MetaKey]; ok {
		return checkKey(v, "_meta."+MetaKey)
	}
	if c.argument == "" || len(p.Arguments) == 0 {
		return "", nil
	}
	var args map[string]json.RawMessage
	if err := json.Unmarshal(p.Arguments, &args); err != nil {
		return "", nil //nolint:nilerr // not an object: no key argument; the tool reports its own input errors
	}
	raw, ok := args[c.argument]
	if !ok {
		return "", nil
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return "", fmt.Errorf("argument %q: %w", c.argument, err)
	}
	return checkKey(v, "argument "+c.argument)
}

// checkKey returns v as a key: a string of 1 to idem.MaxKeyLength bytes.
func checkKey(v any, where string) (string, error) {
	s, ok := v.(string)
	switch {
	case !ok:
		return "", fmt.Errorf("idempotency key (%s) must be a JSON string, got %T", where, v)
	case s == "":
		return "", fmt.Errorf("idempotency key (%s) is empty", where)
	case len(s) > idem.MaxKeyLength:
		return "", fmt.Errorf("idempotency key (%s) is longer than %d bytes", where, idem.MaxKeyLength)
	}
	return s, nil
}

func (c *config) missingMessage(tool string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "tool %q moves state and needs an idempotency key in _meta.%s", tool, MetaKey)
	if c.argument != "" {
		fmt.Fprintf(&b, " or in the argument %q", c.argument)
	}
	b.WriteString(": a unique value (e.g. a UUID) generated once per logical call and sent unchanged with every retry; nothing was executed")
	return b.String()
}

// globalScope reports whether e was built with idem.WithGlobalScope, by
// the documented rule of [idem.Engine.MustHaveScope]: it panics for a
// missing scope function exactly when the engine lacks that option.
func globalScope(e *idem.Engine) (global bool) {
	defer func() {
		if recover() != nil {
			global = false
		}
	}()
	e.MustHaveScope(false, "idemmcp.WithScope")
	return true
}
