package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/observability/idemui"
)

// stepResult returns resolve-step's result: the bytes of -result (nil
// with -not-done), checked against nothing but its size.
func (o *cmdFlags) stepResult(stdin io.Reader) ([]byte, error) {
	switch {
	case o.step == "":
		return nil, errors.New("resolve-step needs -step, the step's name")
	case (o.result == "") == !o.notDone:
		return nil, errors.New("resolve-step needs one of -result FILE (the step happened) and -not-done (it did not)")
	case o.notDone:
		return nil, nil
	case o.result == "-" && !o.yes:
		return nil, errors.New("-result - reads the result from stdin: give -yes too (no confirmation can be read)")
	}
	var b []byte
	var err error
	if o.result == "-" {
		b, err = io.ReadAll(io.LimitReader(stdin, idem.MaxStepBytes+1))
	} else {
		b, err = os.ReadFile(o.result)
	}
	switch {
	case err != nil:
		return nil, fmt.Errorf("-result: %w", err)
	case len(b) == 0:
		return nil, errors.New("-result: the file is empty; give the result as the step's codec encodes it (JSON null for a zero value)")
	case len(b) >= idem.MaxStepBytes:
		return nil, fmt.Errorf("-result: %d bytes or more; a journaled step result is at most %d bytes encoded (idem.MaxStepBytes)", len(b), idem.MaxStepBytes)
	}
	return b, nil
}

// resolveStep runs resolve-step on the record of key (info, found: what
// Inspect returned; a record whose lease lapsed may not be found live):
// after a confirmation, one atomic [idem.ResolveStep].
func resolveStep(ctx context.Context, b *backend, key string, info idem.RecordInfo, found bool, result []byte, o cmdFlags, stdin io.Reader, stdout, stderr io.Writer) int {
	store, ok := b.in.(idem.Store)
	if _, resolves := b.in.(idem.StepResolver); !ok || !resolves {
		fmt.Fprintf(stderr, "idemctl: %s cannot resolve steps (it does not implement idem.StepResolver)\n", b.layout)
		return exitUsage
	}
	fmt.Fprintf(stdout, "scoped key   %s\nstore key    %s\n", key, b.storeKey(key))
	if found {
		printRecord(stdout, info, o.lease, time.Now())
		if j, ok := b.in.(idem.Journal); ok {
			if steps, err := j.Steps(ctx, key); err == nil {
				printSteps(stdout, steps)
			}
		}
	} else {
		fmt.Fprintln(stdout, "no live record: absent, expired, or in progress with its lease lapsed (the store decides)")
	}
	if !o.yes {
		what := fmt.Sprintf("the result in %s (%d bytes)", o.result, len(result))
		fmt.Fprintf(stdout, "%s %s [y/N] ", idemui.ResolveStepQuestion(o.step, !o.notDone, what), idemui.ResolveStepSteps)
		line, _ := bufio.NewReader(stdin).ReadString('\n')
		if a := strings.ToLower(strings.TrimSpace(line)); a != "y" && a != "yes" {
			fmt.Fprintln(stdout, "not resolved")
			return exitFail
		}
	}
	switch err := idem.ResolveStep(ctx, store, key, o.step, result, !o.notDone); {
	case errors.Is(err, idem.ErrRecordChanged):
		fmt.Fprintf(stdout, "not resolved: the record is not uncertain or in progress with a lapsed lease with step %s started and not done (completed, its lease held, expired, no such step, or the step done); run idemctl show again\n", o.step)
		return exitFail
	case errors.Is(err, idem.ErrStepName):
		fmt.Fprintf(stderr, "idemctl: -step: %v\n", err)
		return exitUsage
	case err != nil:
		fmt.Fprintf(stderr, "idemctl: resolve-step: %v\n", err)
		return exitFail
	}
	if o.notDone {
		fmt.Fprintf(stdout, "resolved: step %s not done; the next retry (or a recoverer) resumes the handler and runs it\n", o.step)
	} else {
		fmt.Fprintf(stdout, "resolved: step %s done with %d bytes of result; the next retry (or a recoverer) resumes the handler after it\n", o.step, len(result))
	}
	return exitOK
}

// Bounds on what show prints of a step result and a response body; -body
// writes a body whole.
const (
	maxShownStep = 512
	maxShownBody = 2048
)

// shown renders b for a line of show's output: as it is when it is UTF-8
// text without control characters but a final newline (JSON, most often),
// else Go-quoted; longer than limit bytes, its first limit bytes and the
// total size.
func shown(b []byte, limit int) string {
	cut := b
	if len(cut) > limit {
		cut = cut[:limit]
		for len(cut) > 0 && !utf8.RuneStart(b[len(cut)]) { // don't split a character
			cut = cut[:len(cut)-1]
		}
	}
	s := strings.TrimSuffix(strings.TrimSuffix(string(cut), "\n"), "\r")
	if !utf8.ValidString(s) || strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 && r != '\t' || r == 0x7f }) {
		s = fmt.Sprintf("%q", cut)
	}
	if len(cut) < len(b) {
		s += fmt.Sprintf(" … (first %d of %d bytes)", len(cut), len(b))
	}
	return s
}
