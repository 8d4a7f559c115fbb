package idemmcp

import (
	"context"
	"encoding/json"
	"fmt"

	idem "github.com/idemkit/idem/core"
	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// WithRecovery makes the named tools of server recoverable by r (an
// idem.Recoverer of the middleware's engine), and guards them as
// [WithToolNames] does: a call's record keeps the tool's arguments, the
// principal and the idempotency key (idem.Operation.Recover, the arguments
// as its Input), so that when the instance running the call stopped
// (crashed, or stalled past its lease) and the agent does not come back,
// r runs the tool's handler again with the stored arguments and principal,
// outside any client session, and stores its result: the agent's retry,
// whenever it comes, gets it replayed. Finished steps (idem.Step) replay.
//
// The recovery run enters the server below this middleware (what is
// added after it with AddReceivingMiddleware, which wraps it, is not
// run), in a session of its own over in-memory transports with a client
// that declares no capabilities (sampling and elicitation fail). Its
// CallToolRequest carries Extra.TokenInfo with the stored principal as
// UserID, no HTTP header, and _meta with the key only; [WithScope]'s
// function is not called. The middleware registers the runs with r
// (idem.Recoverer.Handle) when the server adds it; r needs no request
// runner for them. Optional. Default is no tool recoverable.
func WithRecovery(r *idem.Recoverer, server *mcp.Server, tools ...string) Option {
	return func(c *config) {
		c.recoverer, c.server = r, server
		if c.recover == nil {
			c.recover = map[string]bool{}
		}
		for _, t := range tools {
			c.tools[t], c.recover[t] = true, true
		}
	}
}

// recoveringKey marks the context of a recovery run; its value is the
// stored principal.
type recoveringKey struct{}

// handleRecovery registers the recovery runs of WithRecovery's tools,
// which call next, the handler below the middleware.
func (c *config) handleRecovery(e *idem.Engine, global bool, next mcp.MethodHandler) {
	if c.recoverer == nil {
		return
	}
	for tool := range c.recover {
		c.recoverer.Handle(OperationPrefix+tool, func(ctx context.Context, op idem.Operation) error {
			return c.rerun(ctx, e, global, next, tool, op)
		})
	}
}

// rerun runs a recovered call of tool in a session of its own.
func (c *config) rerun(ctx context.Context, e *idem.Engine, global bool, next mcp.MethodHandler, tool string, op idem.Operation) error {
	st, ct := mcp.NewInMemoryTransports()
	ss, err := c.server.Connect(ctx, st, nil)
	if err != nil {
		return fmt.Errorf("idemmcp: recovery session: %w", err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "idem-recoverer", Version: "v1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		_ = ss.Close()
		_ = ss.Wait()
		return fmt.Errorf("idemmcp: recovery session: %w", err)
	}
	defer func() {
		_ = cs.Close()
		_ = ss.Wait()
	}()
	call := &mcp.CallToolRequest{
		Session: ss,
		Params:  &mcp.CallToolParamsRaw{Name: tool, Arguments: json.RawMessage(op.Input), Meta: mcp.Meta{MetaKey: op.Key}},
		Extra:   &mcp.RequestExtra{TokenInfo: &auth.TokenInfo{UserID: op.Scope}},
	}
	_, err = c.serve(context.WithValue(ctx, recoveringKey{}, op.Scope), e, global, next, call)
	return err
}
