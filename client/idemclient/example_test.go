package idemclient_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
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

// Resuming after giving up: the server was down for longer than the time
// budget (1 min by default; 200ms here), so the call ends with the key; the
// caller sends the request again later with that key, and gets the answer
// of the one execution (replayed, had the first call's attempt executed).
func ExampleGaveUpError_resume() {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	_ = ln.Close() // the server is down: connections are refused

	client := &http.Client{Transport: idemclient.New(idemclient.WithMaxElapsed(200 * time.Millisecond))}
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/payments", strings.NewReader(`{"amount":1999}`))
	_, err := client.Do(req)
	var gaveUp *idemclient.GaveUpError
	if !errors.As(err, &gaveUp) {
		fmt.Println(err)
		return
	}
	fmt.Println("out of time:", errors.Is(err, idemclient.ErrOutOfTime), "key kept:", gaveUp.Key != "")

	// Later, the server is back on its address.
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		fmt.Println(err)
		return
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Println("server got key:", r.Header.Get(idemclient.HeaderKey) == gaveUp.Key)
		w.WriteHeader(http.StatusCreated)
	}))
	_ = srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	defer srv.Close()

	ctx := idemclient.WithKey(context.Background(), gaveUp.Key) // resume with the same key
	req, _ = http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/payments", strings.NewReader(`{"amount":1999}`))
	resp, err := client.Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = resp.Body.Close()
	fmt.Println(resp.StatusCode)
	client.CloseIdleConnections()
	// Output:
	// out of time: true key kept: true
	// server got key: true
	// 201
}
