package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestServe: `idemctl serve` on Redis prints where it listens, sends a
// browser without a session to the login page, shows the crashed
// process's record once logged in with the token, and stops when
// interrupted. Without a token it is read-only.
func TestServe(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b := redisBackend(t)
	key := randomHex(64)
	if _, ok, err := b.store.Acquire(ctx, key, "web-3:4242:K7QXR2MZLJ2XW5RV.17", "fp", time.Hour); err != nil || !ok {
		t.Fatalf("Acquire = %v, %v", ok, err)
	}
	const token = "serve-test-token-0123456789"

	for _, tc := range []struct {
		name string
		args []string
	}{{"token", []string{"-token", token}}, {"read-only", nil}} {
		t.Run(tc.name, func(t *testing.T) {
			sctx, stop := context.WithCancel(ctx)
			out, w := io.Pipe()
			code := make(chan int, 1)
			var errOut strings.Builder
			go func() {
				defer func() { _ = w.Close() }()
				code <- serve(sctx, append(append([]string{"-addr", "127.0.0.1:0"}, b.args...), tc.args...), w, &errOut)
			}()
			line, err := bufio.NewReader(out).ReadString('\n')
			go func() { _, _ = io.Copy(io.Discard, out) }()
			m := regexp.MustCompile(`at (http://\S+/) `).FindStringSubmatch(line)
			if err != nil || m == nil {
				stop()
				t.Fatalf("serve printed %q, %v; stderr %s", line, err, errOut.String())
			}
			base := strings.TrimSuffix(m[1], "/")
			jar, _ := cookiejar.New(nil)
			c := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
			get := func(path string) (int, string, string) {
				t.Helper()
				resp, err := c.Get(base + path)
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = resp.Body.Close() }()
				body, _ := io.ReadAll(resp.Body)
				return resp.StatusCode, string(body), resp.Header.Get("Location")
			}
			if tc.args != nil {
				if code, _, loc := get("/record/" + key); code != http.StatusSeeOther || loc != "/login" {
					t.Fatalf("GET without a session = %d, Location %q", code, loc)
				}
				req, _ := http.NewRequest("POST", base+"/login", strings.NewReader(url.Values{"operator": {"ops"}, "token": {token}}.Encode()))
				req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				req.Header.Set("Origin", base)
				resp, err := c.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				_ = resp.Body.Close()
				if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/" {
					t.Fatalf("login = %d, %q", resp.StatusCode, resp.Header.Get("Location"))
				}
			}
			status, page, _ := get("/record/" + key)
			if status != http.StatusOK || !strings.Contains(page, "web-3:4242") || !strings.Contains(page, "in-progress") {
				t.Fatalf("GET /record = %d\n%s", status, page)
			}
			wantMode := "writes enabled"
			if tc.args == nil {
				wantMode = "read-only"
			}
			if !strings.Contains(page, wantMode) || (tc.args != nil) != strings.Contains(page, "confirm?action=evict") {
				t.Fatalf("GET /record: want %q, actions only with a token\n%s", wantMode, page)
			}
			stop()
			if got := <-code; got != exitOK {
				t.Fatalf("serve = %d; stderr %s", got, errOut.String())
			}
		})
	}
}
