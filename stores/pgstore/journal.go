package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	idem "github.com/idemkit/idem/core"
)

// StartStep implements [idem.Journal]: one conditional UPDATE of the
// token's leased row that adds the step to its jsonb journal unless it is
// there (or the journal is full), extends the row's end by retain past the
// lease, and returns the entry. When it changes nothing, a SELECT tells a
// full journal from a lost lease.
func (s *Store) StartStep(ctx context.Context, key, token, name string, retain time.Duration) (idem.StepEntry, error) {
	if retain <= 0 {
		return idem.StepEntry{}, idem.ErrInvalidDuration
	}
	if err := ctx.Err(); err != nil {
		return idem.StepEntry{}, err
	}
	var (
		by     string
		result []byte
		done   bool
	)
	err := s.pool.QueryRow(ctx, s.q.startStep, key, token, name, keepMicros(retain)).Scan(&by, &result, &done)
	if errors.Is(err, pgx.ErrNoRows) {
		var leased bool
		if err := s.pool.QueryRow(ctx, s.q.stepRefused, key, token).Scan(&leased); err != nil {
			return idem.StepEntry{}, fmt.Errorf("pgstore: start step: %w", err)
		}
		if leased {
			return idem.StepEntry{}, idem.ErrTooManySteps
		}
		return idem.StepEntry{}, idem.ErrNotOwner
	}
	if err != nil {
		return idem.StepEntry{}, fmt.Errorf("pgstore: start step: %w", err)
	}
	e := idem.StepEntry{Name: name, Token: by, Done: done}
	if done {
		e.Result = nonNil(result)
	}
	return e, nil
}

// nonNil returns b, or an empty slice for nil (a done step's empty result).
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// FinishStep implements [idem.Journal]: one conditional UPDATE of the
// token's leased row that sets the step's result unless it has one.
func (s *Store) FinishStep(ctx context.Context, key, token, name string, result []byte) error {
	if len(result) > idem.MaxStepBytes {
		return idem.ErrTooLarge
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	tag, err := s.pool.Exec(ctx, s.q.finishStep, key, token, name, nonNil(result))
	if err != nil {
		return fmt.Errorf("pgstore: finish step: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return idem.ErrNotOwner
	}
	return nil
}

// Suspend implements [idem.Journal]: one conditional UPDATE that ends the
// token's lease now and keeps the row uncertain for keep.
func (s *Store) Suspend(ctx context.Context, key, token string, keep time.Duration) error {
	if keep <= 0 {
		return idem.ErrInvalidDuration
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.suspend(ctx, s.pool, key, token, keep)
}

func (s *Store) suspend(ctx context.Context, db execer, key, token string, keep time.Duration) error {
	tag, err := db.Exec(ctx, s.q.suspend, key, token, keepMicros(keep))
	if err != nil {
		return fmt.Errorf("pgstore: suspend: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return idem.ErrNotOwner
	}
	return nil
}

// Steps implements [idem.Journal]: one SELECT of the live row's journal.
func (s *Store) Steps(ctx context.Context, key string) ([]idem.StepEntry, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, s.q.steps, key)
	if err != nil {
		return nil, fmt.Errorf("pgstore: steps: %w", err)
	}
	var steps []idem.StepEntry
	for rows.Next() {
		var e idem.StepEntry
		var result []byte
		if err := rows.Scan(&e.Name, &e.Token, &e.Done, &result); err != nil {
			rows.Close()
			return nil, fmt.Errorf("pgstore: steps: %w", err)
		}
		if e.Done {
			e.Result = nonNil(result)
		}
		steps = append(steps, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgstore: steps: %w", err)
	}
	return steps, nil
}

// Suspend implements [idem.SuspendUnit]: it rolls the handler's writes
// back, then suspends the record with [Store.Suspend].
func (u *unit) Suspend(ctx context.Context, keep time.Duration) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.ended = true
	if u.tx != nil && u.outcome == txOpen {
		u.rollback(ctx)
	}
	return u.s.Suspend(ctx, u.key, u.token, keep)
}
