package adaptertest

import (
	"bufio"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// Process is a server process a test kills (SIGKILL, as a crash or an OOM
// kill would) and starts again with the same command: the client tests'
// restarts. The server must print a line starting with "listening" on its
// stdout once it accepts connections; for a restart on the same address,
// give it a fixed one ([FreeAddr]). The lines it prints are kept, across
// runs, for [Process.Lines]; its stderr goes to the test's.
type Process struct {
	t      testing.TB
	name   string
	args   []string
	env    []string
	cmd    *exec.Cmd
	exited chan struct{}
	runs   int

	mu    sync.Mutex
	lines []string
}

// Lines returns how many lines starting with prefix the process printed
// on its stdout, over all its runs so far (a killed run's included: its
// lines reach the pipe as it prints them).
func (p *Process) Lines(prefix string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, l := range p.lines {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}

// StartProcess starts name with args and env (added to the test's
// environment) and waits until it listens; it is killed at cleanup. With
// name os.Args[0] and args "-test.run=^$", it is the test binary itself,
// whose TestMain serves when it sees env.
func StartProcess(t testing.TB, name string, args []string, env ...string) *Process {
	t.Helper()
	p := &Process{t: t, name: name, args: args, env: env}
	t.Cleanup(p.Kill)
	p.Start()
	return p
}

// Start starts the process again (after [Process.Kill]) and waits, for up
// to two minutes, until it prints its "listening" line.
func (p *Process) Start() {
	p.t.Helper()
	p.cmd = exec.Command(p.name, p.args...) //nolint:gosec // the test's own command
	p.cmd.Env = append(os.Environ(), p.env...)
	p.cmd.Stderr = os.Stderr
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		p.t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	p.runs++
	ready, read := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(out)
		for seen := false; sc.Scan(); {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			p.mu.Unlock()
			if !seen && strings.HasPrefix(sc.Text(), "listening") {
				seen = true
				close(ready)
			}
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	exited := make(chan struct{})
	p.exited = exited
	cmd := p.cmd
	go func() { <-read; _ = cmd.Wait(); close(exited) }() // Wait closes the pipe: after the last line
	select {
	case <-ready:
	case <-exited:
		p.t.Fatalf("%s (run %d) exited before listening", p.name, p.runs)
	case <-time.After(2 * time.Minute):
		p.t.Fatalf("%s (run %d) did not listen within 2 minutes", p.name, p.runs)
	}
}

// Kill SIGKILLs the process, if it runs, and waits until it is gone: its
// connections are reset and its port is free.
func (p *Process) Kill() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.exited
	p.cmd = nil
}

// FreeAddr returns a loopback address ("127.0.0.1:port") nothing listens
// on: connections to it are refused until a server listens there.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// KillMidCall runs call (a client's call to p's server) in the background,
// waits until started reports that the server began executing it, and
// kills p there, in the middle of the execution. With down >= 0 it starts
// p again on its address after down; with down < 0 the server never comes
// back. It returns what call returned, waiting for it for up to three
// minutes (a hang guard: the clients' default budget is one minute), and
// fails t when call returns before the execution started.
func KillMidCall[T any](t testing.TB, p *Process, down time.Duration, started func() bool, call func() T) T {
	t.Helper()
	result := make(chan T, 1)
	go func() { result <- call() }()
	for deadline := time.Now().Add(2 * time.Minute); !started(); time.Sleep(10 * time.Millisecond) {
		select {
		case r := <-result:
			t.Fatalf("the call ended before the server started executing it: %+v", r)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the server did not start executing the call within 2 minutes")
		}
	}
	p.Kill()
	if down >= 0 {
		time.Sleep(down)
		p.Start()
	}
	select {
	case r := <-result:
		return r
	case <-time.After(3 * time.Minute):
		t.Fatal("the call did not end within 3 minutes of the kill")
	}
	var zero T
	return zero
}
