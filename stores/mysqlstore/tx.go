package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	idem "github.com/idemkit/idem/core"
)

// ErrNoExecution is returned by [Tx] when ctx is not the context of a
// handler the engine executes on a mysqlstore Store (request not covered,
// replayed, fail-open, or an adapter that did not bind the context).
var ErrNoExecution = errors.New("mysqlstore: context carries no execution of a mysqlstore Store")

// ErrExecutionEnded is returned by [Tx] once the engine completed, released
// or rolled back the execution: its transaction is committed or rolled back.
var ErrExecutionEnded = errors.New("mysqlstore: the execution has ended; its transaction is closed")

// ErrRolledBack is returned (wrapped, with the cause) by the completion of
// an execution whose transaction failed before its commit: the handler's
// writes are gone, so its response must not be stored. It wraps
// [idem.ErrNotOwner]: the engine does not retry it, and the key is released
// (best effort) so that a retry executes again; a record with a step
// journal is left to lapse at once instead, so that the retry replays its
// steps done.
var ErrRolledBack = fmt.Errorf("mysqlstore: the execution's transaction was rolled back: %w", idem.ErrNotOwner)

// Tx returns the transaction of the execution whose handler ctx belongs
// to, beginning it (one round trip, START TRANSACTION at the server's
// default isolation level; one connection of the *sql.DB held until the
// end of the execution) on the first call; later calls return the same
// one. Write through it: the engine commits it together with the
// completed record, so the writes and the stored response persist
// together or not at all. It rolls it back when the response is not
// stored (5xx, handler error, panic before a response), when the lease
// was lost (taken over after it lapsed), or when the completion fails.
//
// The handler must not call Commit or Rollback on it (a *sql.Tx cannot
// refuse them): that ends the transaction early, and the engine then
// completes the record on its own, outside any transaction, as a store
// without transactional completion would (logged as a warning). The
// transaction outlives ctx's cancellation (the engine ends it); statements
// still run with the contexts they are given. Like any *sql.Tx it is not
// safe for concurrent use of its results.
//
// Errors: [ErrNoExecution], [ErrExecutionEnded], a failed BEGIN wrapped.
func Tx(ctx context.Context) (*sql.Tx, error) {
	u, ok := idem.UnitFromContext(ctx).(*unit)
	if !ok {
		return nil, ErrNoExecution
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.ended {
		return nil, ErrExecutionEnded
	}
	if u.tx == nil {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		// database/sql rolls a transaction back when its context ends; this
		// one ends when the engine completes or releases the execution.
		tx, err := u.s.db.BeginTx(context.WithoutCancel(ctx), nil)
		if err != nil {
			return nil, fmt.Errorf("mysqlstore: begin the execution's transaction: %w", err)
		}
		u.tx = tx
	}
	return u.tx, nil
}

// The Units of [Store.Unit] roll back without releasing their record.
var _ idem.RollbackUnit = (*unit)(nil)

// Unit implements [idem.Transactional]; it does no I/O.
func (s *Store) Unit(key, token string) idem.Unit { return &unit{s: s, key: key, token: token} }

// Outcomes of a unit's transaction.
const (
	txOpen      = iota // not begun, or begun and not ended
	txCommitted        // committed with the completed record
	txRolledBack
	txUnknown // the COMMIT failed: committed or not, the server knows
)

// unit is one execution's transaction, begun by the first Tx call.
type unit struct {
	s          *Store
	key, token string

	mu      sync.Mutex
	ended   bool    // Complete, Release or Rollback was called: Tx refuses
	tx      *sql.Tx // nil until Tx
	outcome int
}

// Complete implements [idem.Unit]. Without a transaction (the handler never
// called Tx) it is [Store.Complete]. With one, it runs the conditional
// completion UPDATE in it and commits: 2 round trips. When the UPDATE finds
// the lease lost it rolls back and returns [idem.ErrNotOwner]; when the
// UPDATE fails it rolls back, releases the key and returns [ErrRolledBack];
// when the COMMIT fails it asks the server whether the record was
// completed under this token.
func (u *unit) Complete(ctx context.Context, response []byte, retention time.Duration) error {
	if retention <= 0 {
		return idem.ErrInvalidDuration
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	u.ended = true
	if u.tx == nil {
		return u.s.Complete(ctx, u.key, u.token, response, retention)
	}
	switch u.outcome {
	case txCommitted:
		return nil
	case txRolledBack:
		return ErrRolledBack
	case txUnknown:
		return u.checkCommit(ctx, nil)
	}
	b := response
	err := u.s.complete(ctx, u.tx, u.key, u.token, b, retention)
	switch {
	case errors.Is(err, sql.ErrTxDone):
		// The handler committed or rolled back itself: its writes no
		// longer depend on the record, which is completed on its own.
		u.outcome = txRolledBack
		u.s.logger.Warn("mysqlstore: the handler ended its execution's transaction; completing the record outside it")
		return u.s.complete(ctx, nil, u.key, u.token, b, retention)
	case errors.Is(err, idem.ErrTooLarge) || errors.Is(err, ErrInvalidID):
		return err // the transaction stays open: the engine completes again with a smaller response
	case err != nil:
		u.rollback()
		if errors.Is(err, idem.ErrNotOwner) {
			return err
		}
		u.releaseBestEffort(ctx)
		return fmt.Errorf("%w: %w", ErrRolledBack, err)
	}
	if err := u.tx.Commit(); err != nil {
		u.outcome = txUnknown
		return u.checkCommit(ctx, err)
	}
	u.outcome = txCommitted
	return nil
}

// checkCommit settles a COMMIT that failed with cause: the record completed
// under this token means it landed; otherwise the writes are gone.
func (u *unit) checkCommit(ctx context.Context, cause error) error {
	done, err := u.s.completedBy(ctx, u.key, u.token)
	switch {
	case err != nil: // still unknown: the engine retries
		if cause != nil {
			return fmt.Errorf("mysqlstore: commit: %w (outcome unknown: %w)", cause, err)
		}
		return err
	case done:
		u.outcome = txCommitted
		return nil
	}
	u.outcome = txRolledBack
	u.releaseBestEffort(ctx)
	if cause != nil {
		return fmt.Errorf("%w: commit: %w", ErrRolledBack, cause)
	}
	return ErrRolledBack
}

// Release implements [idem.Unit]: it rolls the handler's writes back, then
// releases the key with [Store.Release].
func (u *unit) Release(ctx context.Context) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.ended = true
	if u.tx != nil && u.outcome == txOpen {
		u.rollback()
	}
	return u.s.Release(ctx, u.key, u.token)
}

// Rollback implements [idem.RollbackUnit]: it rolls the handler's writes
// back, if the handler began a transaction, and ends the unit ([Tx] refuses
// from then on); the record is left as it is, in progress under the
// unit's token. It does nothing after Complete, Release or an earlier
// Rollback, and returns nil.
func (u *unit) Rollback(context.Context) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.ended = true
	if u.tx != nil && u.outcome == txOpen {
		u.rollback()
	}
	return nil
}

// rollback ends the transaction. If ROLLBACK itself fails, the driver
// closes the connection and the server rolls back.
func (u *unit) rollback() {
	_ = u.tx.Rollback()
	u.outcome = txRolledBack
}

// releaseBestEffort deletes the record still in progress under this token
// after its transaction was rolled back, so a retry need not wait for the
// lease to lapse; on failure the lease lapses instead. A record with a
// step journal (idem.Step) is not deleted but left to lapse at once (its
// lease shortened to 1 ms), its journal kept: the retry takes it over and
// replays the steps done instead of running them again. Only this token
// writes the journal while it holds the lease, so the check is not racy.
func (u *unit) releaseBestEffort(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	if st, err := u.s.Steps(ctx, u.key); err != nil || len(st) > 0 {
		_ = u.s.Extend(ctx, u.key, u.token, time.Millisecond)
		return
	}
	_ = u.s.Release(ctx, u.key, u.token)
}
