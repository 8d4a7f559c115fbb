package idemclient_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/client/idemclient"
)

// A server that fails once, then answers: the client retries with the same
// key and the caller sees the final answer.
func Example() {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()

	client := &http.Client{Transport: idemclient.New(idemclient.WithBackoff(10*time.Millisecond, time.Second))}
	resp, err := client.Post(srv.URL+"/v1/payments", "application/json", strings.NewReader(`{"amount":1999}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	fmt.Println(resp.StatusCode, "after", idemclient.Attempts(resp), "attempts; replayed:", idemclient.Replayed(resp))
	client.CloseIdleConnections()
	// Output: 201 after 2 attempts; replayed: false
}

// A key derived from the caller's durable ids survives a restart: the same
// ids give the same key, and the server replays the first answer.
func ExampleKey() {
	key := idemclient.Key("user-42", "order-1001")
	fmt.Println(key, key == idemclient.Key("user-42", "order-1001"))
	// Output: 34f29c7e-461a-82d3-a3ae-58a41c81bf8f true
}

// Giving up: the error carries the key to come back with later.
func ExampleGaveUpError() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "120") // busy for two minutes
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()

	client := &http.Client{Transport: idemclient.New(idemclient.WithMaxRetryAfter(10 * time.Second))}
	ctx := idemclient.WithKey(context.Background(), "order-1001")
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(`{}`))
	_, err := client.Do(req)
	var gaveUp *idemclient.GaveUpError
	if errors.As(err, &gaveUp) {
		fmt.Println(gaveUp.Key, gaveUp.StatusCode, gaveUp.RetryAfter, errors.Is(err, idemclient.ErrRetryAfterTooLong))
	}
	client.CloseIdleConnections()
	// Output: order-1001 503 2m0s true
}
