package idem

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// shortDuration writes d as the README does: 30s, 24h, 1m.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// TestReadmeDefaults: the defaults the README's Configuration table and
// Recovery section state are the engine's and the recoverer's.
func TestReadmeDefaults(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	_, table, _ := strings.Cut(readme, "\n## Configuration (`idem.New(store, options...)`)\n")
	table, _, _ = strings.Cut(table, "\n### ")
	rows := map[string]string{}
	for _, m := range regexp.MustCompile("(?m)^\\| `(With[A-Za-z]+)\\([^`]*\\)` \\| ([^|]*) \\|").FindAllStringSubmatch(table, -1) {
		rows[m[1]] = strings.TrimSpace(m[2])
	}
	mib := func(n int) string { return fmt.Sprintf("%d MiB", n>>20) }
	for option, want := range map[string]string{
		"WithHeader":           "`" + DefaultHeader + "`",
		"WithLease":            shortDuration(DefaultLease),
		"WithRetention":        shortDuration(DefaultRetention),
		"WithStoreTimeout":     shortDuration(DefaultStoreTimeout),
		"WithMaxBodyBytes":     mib(DefaultMaxBodyBytes),
		"WithMaxResponseBytes": mib(DefaultMaxResponseBytes),
		"WithRetryAfter":       shortDuration(DefaultRetryAfter),
		"WithCompletionRetry":  shortDuration(DefaultCompletionRetry),
	} {
		if got, ok := rows[option]; !ok || got != want {
			t.Errorf("README.md's Configuration table gives %s the default %q; the engine's is %q", option, got, want)
		}
	}
	// The recovery timeline's numbers.
	for _, want := range []string{
		fmt.Sprintf("(`RecoverEvery`, %s ± 25%%)", strings.ReplaceAll(shortDuration(DefaultRecoverInterval), "s", " s")),
		fmt.Sprintf("(`RecoverBackoff`: %s doubling, at most %s)", strings.ReplaceAll(shortDuration(DefaultRecoverBackoff), "s", " s"), strings.ReplaceAll(shortDuration(DefaultRecoverMaxBackoff), "m", " min")),
		fmt.Sprintf("`RecoverAttempts` (%d)", DefaultRecoverAttempts),
		fmt.Sprintf("(at most `idem.MaxRecoveryBytes`, %s;", mib(MaxRecoveryBytes)),
	} {
		if !strings.Contains(readme, want) {
			t.Errorf("README.md's recovery timeline does not say %q", want)
		}
	}
}

// TestReadmeRecoverySnippet: the README's recovery snippet for an HTTP
// route registers no Recoverer.Handle (an HTTP route needs none: Handle
// is for Do operations with Operation.Recover, shown apart), and says what
// RouteRecovery keeps.
func TestReadmeRecoverySnippet(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, block := range regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(string(b), -1) {
		if !strings.Contains(block[1], "idem.RecoverRequests(idem.HTTPRunner(") {
			continue
		}
		found = true
		if strings.Contains(block[1], ".Handle(") {
			t.Errorf("README.md's HTTP recovery snippet calls Recoverer.Handle, which only Do operations need:\n%s", block[1])
		}
		if !strings.Contains(block[1], "RouteRecovery keeps") {
			t.Errorf("README.md's HTTP recovery snippet does not say what RouteRecovery keeps:\n%s", block[1])
		}
	}
	if !found {
		t.Fatal("README.md has no Go block with idem.RecoverRequests(idem.HTTPRunner(...)): the recovery snippet")
	}
}
