package idemclient_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem/client/idemclient"
)

// retried is the whole set of statuses ClassifyStatus retries.
var retried = map[int]bool{409: true, 425: true, 429: true, 500: true, 502: true, 503: true, 504: true}

func TestClassifyStatus(t *testing.T) {
	for status := 100; status <= 599; status++ {
		want := idemclient.Stop
		if retried[status] {
			want = idemclient.Retry
		}
		if got := idemclient.ClassifyStatus(status); got != want {
			t.Errorf("ClassifyStatus(%d) = %v, want %v", status, got, want)
		}
	}
	// Named in the contract: never retried.
	for _, status := range []int{400, 401, 403, 404, 410, 413, 422} {
		if idemclient.ClassifyStatus(status) != idemclient.Stop {
			t.Errorf("%d is retried", status)
		}
	}
	if idemclient.Retry.String() != "retry" || idemclient.Stop.String() != "stop" {
		t.Errorf("Decision.String: %v %v", idemclient.Retry, idemclient.Stop)
	}
}

type timeoutError struct{}

func (timeoutError) Error() string   { return "i/o timeout" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

func TestClassifyError(t *testing.T) {
	opErr := func(op string, err error) error { return &net.OpError{Op: op, Net: "tcp", Err: err} }
	urlErr := func(err error) error { return &url.Error{Op: "Post", URL: "http://x", Err: err} }
	for _, c := range []struct {
		err  error
		want idemclient.Decision
	}{
		{opErr("dial", os.NewSyscallError("connect", syscall.ECONNREFUSED)), idemclient.Retry},
		{opErr("read", os.NewSyscallError("read", syscall.ECONNRESET)), idemclient.Retry},
		{syscall.ECONNRESET, idemclient.Retry},
		{syscall.ECONNABORTED, idemclient.Retry},
		{fmt.Errorf("write: %w", syscall.EPIPE), idemclient.Retry},
		{io.EOF, idemclient.Retry},
		{io.ErrUnexpectedEOF, idemclient.Retry},
		{urlErr(io.EOF), idemclient.Retry},
		{context.DeadlineExceeded, idemclient.Retry},
		{timeoutError{}, idemclient.Retry},
		{opErr("dial", timeoutError{}), idemclient.Retry},
		{opErr("dial", errors.New("no route to host")), idemclient.Retry},
		{errors.New(`net/http: HTTP/1.x transport connection broken: malformed HTTP status code "20"`), idemclient.Retry},
		{&net.DNSError{Err: "server misbehaving", Name: "x", IsTemporary: true}, idemclient.Retry},
		{urlErr(opErr("dial", &net.DNSError{Err: "no such host", Name: "x", IsNotFound: true})), idemclient.Stop},
		{errors.New("rpc error: code = Unavailable desc = dns: A record lookup error: lookup x on 127.0.0.53:53: no such host"), idemclient.Stop},
		{errors.New(`rpc error: code = Unavailable desc = connection error: desc = "transport: authentication handshake failed: remote error: tls: no application protocol"`), idemclient.Stop},
		{errors.New(`rpc error: code = Unavailable desc = connection error: desc = "transport: authentication handshake failed: EOF"`), idemclient.Retry},
		{errors.New("rpc error: code = Unavailable desc = connection error: desc = \"transport: authentication handshake failed: tls: failed to verify certificate: x509: certificate signed by unknown authority\""), idemclient.Stop},
		{errors.New("http2: server sent GOAWAY and closed the connection"), idemclient.Retry},
		{nil, idemclient.Stop},
		{errors.New(`unsupported protocol scheme "ftp"`), idemclient.Stop},
		{errors.New("http: no Host in request URL"), idemclient.Stop},
		{errors.New(`net/http: invalid header field value for "X"`), idemclient.Stop},
		{urlErr(errors.New("net/http: nil Request.URL")), idemclient.Stop},
		{x509.UnknownAuthorityError{}, idemclient.Stop},
		{fmt.Errorf("tls: %w", x509.HostnameError{Host: "x"}), idemclient.Stop},
		{x509.CertificateInvalidError{}, idemclient.Stop},
		{&tls.CertificateVerificationError{Err: errors.New("expired")}, idemclient.Stop},
		{tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}, idemclient.Stop},
		{context.Canceled, idemclient.Stop},
		{urlErr(context.Canceled), idemclient.Stop},
	} {
		if got := idemclient.ClassifyError(c.err); got != c.want {
			t.Errorf("ClassifyError(%#v) = %v, want %v", c.err, got, c.want)
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		value string
		want  time.Duration
		ok    bool
	}{
		{"0", 0, true},
		{"1", time.Second, true},
		{"120", 2 * time.Minute, true},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{now.Add(90 * time.Second).Format(time.RFC850), 90 * time.Second, true}, // obsolete forms RFC 9110 accepts
		{now.Add(90 * time.Second).Format(time.ANSIC), 90 * time.Second, true},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0, true}, // in the past: no wait
		{"", 0, false},
		{"-1", 0, false},
		{"1.5", 0, false},
		{" 1", 0, false},
		{"soon", 0, false},
		{"99999999999", 0, false}, // beyond 32 bits
	} {
		got, ok := idemclient.ParseRetryAfter(c.value, now)
		if got != c.want || ok != c.ok {
			t.Errorf("ParseRetryAfter(%q) = %v, %v; want %v, %v", c.value, got, ok, c.want, c.ok)
		}
	}
}

func TestBackoff(t *testing.T) {
	base, maxDelay := 100*time.Millisecond, 2*time.Second
	for retry := 0; retry <= 70; retry++ {
		ceiling := maxDelay
		if retry <= 5 {
			ceiling = base << max(retry-1, 0) // 100ms, 200ms, ... 1.6s
		}
		var top time.Duration
		for range 500 {
			d := idemclient.Backoff(retry, base, maxDelay)
			if d < 0 || d > ceiling {
				t.Fatalf("Backoff(%d) = %v, outside [0, %v]", retry, d, ceiling)
			}
			top = max(top, d)
		}
		if top < ceiling/2 { // full jitter spreads over the whole range (p < 2^-500 of failing)
			t.Errorf("Backoff(%d): 500 draws all below %v", retry, ceiling/2)
		}
	}
	if d := idemclient.Backoff(200, time.Hour, 24*time.Hour); d < 0 || d > 24*time.Hour { // no overflow
		t.Errorf("Backoff with a huge exponent = %v", d)
	}
	if d := idemclient.Backoff(3, 0, time.Second); d != 0 {
		t.Errorf("Backoff with base 0 = %v", d)
	}
}
