// Command cpuload keeps the CPU busy for make test-under-load: -workers
// goroutines (default 2 × the cores), each on its own OS thread, hash in a
// loop, so that the load average rises by about -workers, as a shared CI
// runner or a laptop building beside the tests would. It stops on SIGINT or
// SIGTERM, after -for, or as soon as the process -parent names (default:
// the one that started it) exits, so that it cannot outlive the run it
// loads.
//
//	GOWORK=off go build -o .tmp/bin/cpuload tools/cpuload/main.go
//	.tmp/bin/cpuload [-workers N] [-for 2h] [-parent PID]
package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"sync"
	"syscall"
	"time"
)

func main() {
	workers := flag.Int("workers", 2*runtime.NumCPU(), "busy goroutines, each on its own OS thread")
	limit := flag.Duration("for", 2*time.Hour, "stop after this long at the latest")
	parent := flag.Int("parent", os.Getppid(), "stop when the process with this id exits")
	flag.Parse()
	if *workers < 1 || *limit <= 0 {
		fmt.Fprintln(os.Stderr, "cpuload: -workers must be >= 1 and -for > 0")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *limit)
	defer cancel()
	go watchParent(ctx, cancel, *parent)

	// Every worker runnable at once: the scheduler would otherwise run
	// only GOMAXPROCS of them, and the load average would rise by the cores.
	runtime.GOMAXPROCS(*workers)
	start := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var rounds uint64
	for range *workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			n := spin(ctx)
			mu.Lock()
			rounds += n
			mu.Unlock()
		}()
	}
	fmt.Fprintf(os.Stderr, "cpuload: %d workers on %d cores (pid %d)\n", *workers, runtime.NumCPU(), os.Getpid())
	wg.Wait()
	fmt.Fprintf(os.Stderr, "cpuload: stopped after %v, %d hashes of 4 KiB\n", time.Since(start).Round(time.Second), rounds)
}

// spin hashes a 4 KiB block until ctx ends and returns the hashes done.
func spin(ctx context.Context) uint64 {
	var block [4096]byte
	var n uint64
	for {
		for range 256 { // about a millisecond of work between checks
			sum := sha256.Sum256(block[:])
			block[n%uint64(len(block))] ^= sum[0]
			n++
		}
		if ctx.Err() != nil {
			return n
		}
	}
}

// watchParent cancels once the process parent is gone: the script that
// started the load exited without stopping it (killed, say).
func watchParent(ctx context.Context, cancel context.CancelFunc, parent int) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := syscall.Kill(parent, 0); errors.Is(err, syscall.ESRCH) {
				cancel()
				return
			}
		}
	}
}
