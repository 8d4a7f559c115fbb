package idemui

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// AuditEntry is one operator action, as the console records it.
type AuditEntry struct {
	// Time is when the action ended, UTC.
	Time time.Time
	// Operator is who acted, as [WithWrites]' hook or the [WithToken]
	// session named them.
	Operator string
	// Action is "evict", "release", "complete" or "resolve-step".
	Action string
	// Key is the record's scoped key (64 hex characters).
	Key string
	// Detail says what the action gave: the step and "done with N bytes of
	// result" or "not done" (resolve-step), the status and retention
	// (complete); empty otherwise.
	Detail string
	// Before and After describe the record before and after the action
	// (state, lease, owner), as the console read it.
	Before, After string
	// Err is why the action failed; empty when it succeeded.
	Err string
}

// AuditSink receives each action's [AuditEntry] ([WithAudit]), after the
// action. An error is logged; the action is not undone.
type AuditSink interface {
	Audit(ctx context.Context, e AuditEntry) error
}

// AuditReader is an [AuditSink] the console reads entries back from, to
// show them on the audit page and on a record's page.
type AuditReader interface {
	// Entries returns up to limit entries, newest first: those of key,
	// or all when key is "".
	Entries(ctx context.Context, key string, limit int) ([]AuditEntry, error)
}

// AuditLog is an [AuditSink] and [AuditReader] that keeps the last
// entries in memory: the console's default. Its entries die with the
// process; a service that must keep them sends them elsewhere with
// [WithAudit] (its log lines, [WithLogger], carry them too).
type AuditLog struct {
	mu      sync.Mutex
	entries []AuditEntry // oldest first
	max     int
}

// NewAuditLog returns an AuditLog that keeps the last max (> 0) entries.
func NewAuditLog(max int) *AuditLog { return &AuditLog{max: max} }

// Audit keeps e, dropping the oldest entry when the log is full.
func (l *AuditLog) Audit(_ context.Context, e AuditEntry) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.entries) >= l.max {
		l.entries = append(l.entries[:0], l.entries[1:]...)
	}
	l.entries = append(l.entries, e)
	return nil
}

// Entries returns up to limit entries of key (all keys when ""), newest
// first.
func (l *AuditLog) Entries(_ context.Context, key string, limit int) ([]AuditEntry, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []AuditEntry
	for i := len(l.entries) - 1; i >= 0 && len(out) < limit; i-- {
		if key == "" || l.entries[i].Key == key {
			out = append(out, l.entries[i])
		}
	}
	return out, nil
}

// recordAudit logs e and sends it to the sink.
func (c *console) recordAudit(ctx context.Context, e AuditEntry) {
	level := slog.LevelInfo
	if e.Err != "" {
		level = slog.LevelWarn
	}
	c.cfg.logger.Log(ctx, level, "idemui: operator action", "operator", e.Operator, "action", e.Action, "key", e.Key,
		"detail", e.Detail, "before", e.Before, "after", e.After, "err", e.Err)
	if err := c.cfg.audit.Audit(ctx, e); err != nil {
		c.cfg.logger.ErrorContext(ctx, "idemui: the audit sink refused an entry", "key", e.Key, "action", e.Action, "err", err)
	}
}
