package mysqlstore

import (
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	idem "github.com/idemkit/idem/core"
)

var _ idem.Journal = (*Store)(nil)

// stepPath returns the JSON path of step name in the steps column: $."name"
// ([idem.Step] allows only [A-Za-z0-9_:/-] in names; anything else is
// refused here too, so no name can reach the path unescaped).
func stepPath(name string) (string, error) {
	if name == "" || len(name) > idem.MaxStepName || strings.Trim(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_:/-") != "" {
		return "", fmt.Errorf("%w: %q", idem.ErrStepName, name)
	}
	return `$."` + name + `"`, nil
}

// StartStep implements [idem.Journal]: one conditional UPDATE of the
// token's leased row adds the step to its JSON journal unless it is there
// (or the journal is full) and moves the row's end to retain past its
// lease's end; a SELECT then reads the entry, or tells a full journal from
// a lost lease. 2 round trips.
func (s *Store) StartStep(ctx context.Context, key, token, name string, retain time.Duration) (idem.StepEntry, error) {
	if retain <= 0 {
		return idem.StepEntry{}, idem.ErrInvalidDuration
	}
	if err := ctx.Err(); err != nil {
		return idem.StepEntry{}, err
	}
	if err := checkIDs(key, token); err != nil {
		return idem.StepEntry{}, err
	}
	path, err := stepPath(name)
	if err != nil {
		return idem.StepEntry{}, err
	}
	st, err := s.stmt(ctx, s.q.startStep)
	if err != nil {
		return idem.StepEntry{}, fmt.Errorf("mysqlstore: start step: %w", err)
	}
	if _, err := st.ExecContext(ctx, micros(retain), path, path, token, key, token, path); err != nil {
		return idem.StepEntry{}, fmt.Errorf("mysqlstore: start step: %w", err)
	}
	leased, by, result, err := s.stepOf(ctx, key, token, path)
	switch {
	case err != nil:
		return idem.StepEntry{}, fmt.Errorf("mysqlstore: start step: %w", err)
	case !leased:
		return idem.StepEntry{}, idem.ErrNotOwner
	case !by.Valid:
		return idem.StepEntry{}, idem.ErrTooManySteps
	}
	e := idem.StepEntry{Name: name, Token: by.String, Done: result.Valid}
	if e.Done {
		if e.Result, err = decodeResult(result.String); err != nil {
			return idem.StepEntry{}, err
		}
	}
	return e, nil
}

// stepOf reads whether token holds key's lease, and the entry at path.
func (s *Store) stepOf(ctx context.Context, key, token, path string) (leased bool, by, result sql.NullString, err error) {
	st, err := s.stmt(ctx, s.q.stepOf)
	if err != nil {
		return false, by, result, err
	}
	err = st.QueryRowContext(ctx, key, token, path, path, key).Scan(&leased, &by, &result)
	if errors.Is(err, sql.ErrNoRows) {
		return false, by, result, nil
	}
	return leased, by, result, err
}

// decodeResult decodes a result as TO_BASE64 wrote it (lines of 76 characters).
func decodeResult(s string) ([]byte, error) {
	b, err := base64.StdEncoding.DecodeString(strings.ReplaceAll(s, "\n", ""))
	if err != nil {
		return nil, fmt.Errorf("%w: step result: %w", ErrCorrupt, err)
	}
	if b == nil {
		b = []byte{}
	}
	return b, nil
}

// FinishStep implements [idem.Journal]: one conditional UPDATE of the
// token's leased row sets the step's result unless it has one; when it
// changes nothing, a SELECT tells a done step (nil) from a lost lease.
func (s *Store) FinishStep(ctx context.Context, key, token, name string, result []byte) error {
	if len(result) > idem.MaxStepBytes {
		return idem.ErrTooLarge
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := checkIDs(key, token); err != nil {
		return err
	}
	path, err := stepPath(name)
	if err != nil {
		return err
	}
	st, err := s.stmt(ctx, s.q.finishStep)
	if err != nil {
		return fmt.Errorf("mysqlstore: finish step: %w", err)
	}
	if result == nil {
		result = []byte{}
	}
	res, err := st.ExecContext(ctx, path, result, key, token, path, path)
	if err != nil {
		return fmt.Errorf("mysqlstore: finish step: %w", err)
	}
	if ownedRow(res, "finish step") == nil {
		return nil
	}
	leased, _, done, err := s.stepOf(ctx, key, token, path)
	switch {
	case err != nil:
		return fmt.Errorf("mysqlstore: finish step: %w", err)
	case leased && done.Valid:
		return nil // done already: a retry whose first reply was lost
	}
	return idem.ErrNotOwner
}

// Suspend implements [idem.Journal]: one conditional UPDATE ends the
// token's lease now and keeps the row uncertain for keep.
func (s *Store) Suspend(ctx context.Context, key, token string, keep time.Duration) error {
	if keep <= 0 {
		return idem.ErrInvalidDuration
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := checkIDs(key, token); err != nil {
		return err
	}
	st, err := s.stmt(ctx, s.q.suspend)
	if err != nil {
		return fmt.Errorf("mysqlstore: suspend: %w", err)
	}
	res, err := st.ExecContext(ctx, micros(keep), key, token)
	if err != nil {
		return fmt.Errorf("mysqlstore: suspend: %w", err)
	}
	return ownedRow(res, "suspend")
}

// journalEntry is one step in the steps column.
type journalEntry struct {
	I int     `json:"i"`
	T string  `json:"t"`
	R *string `json:"r"`
}

// Steps implements [idem.Journal]: one SELECT of the live row's journal.
func (s *Store) Steps(ctx context.Context, key string) ([]idem.StepEntry, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	st, err := s.stmt(ctx, s.q.steps)
	if err != nil {
		return nil, fmt.Errorf("mysqlstore: steps: %w", err)
	}
	var raw sql.NullString
	err = st.QueryRowContext(ctx, key).Scan(&raw)
	if errors.Is(err, sql.ErrNoRows) || err == nil && !raw.Valid {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("mysqlstore: steps: %w", err)
	}
	var m map[string]journalEntry
	if err := json.Unmarshal([]byte(raw.String), &m); err != nil {
		return nil, fmt.Errorf("%w: steps: %w", ErrCorrupt, err)
	}
	steps := make([]idem.StepEntry, 0, len(m))
	order := make(map[string]int, len(m))
	for name, je := range m {
		e := idem.StepEntry{Name: name, Token: je.T, Done: je.R != nil}
		if e.Done {
			if e.Result, err = decodeResult(*je.R); err != nil {
				return nil, err
			}
		}
		order[name] = je.I
		steps = append(steps, e)
	}
	slices.SortFunc(steps, func(a, b idem.StepEntry) int { return order[a.Name] - order[b.Name] })
	if len(steps) == 0 {
		return nil, nil
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
		u.rollback()
	}
	return u.s.Suspend(ctx, u.key, u.token, keep)
}
