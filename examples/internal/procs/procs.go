// Package procs builds the example services and runs them as separate
// processes on free loopback ports, for the demo and for tests that need
// real processes (several instances, SIGKILL mid-request).
package procs

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Frameworks lists the HTTP frameworks the payments service is served
// through (its -framework values but grpc, which serves another contract).
var Frameworks = []string{"nethttp", "gin", "echo", "echov5", "fiber", "fiberv3"}

// Build compiles examples/<name> into dir and returns the binary's path:
// "payments" is the payments service, run with "-framework" and one of
// Frameworks.
func Build(ctx context.Context, dir, name string) (string, error) {
	bin := filepath.Join(dir, name)
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/idemkit/idem/examples/"+name)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build examples/%s: %w\n%s", name, err, out)
	}
	return bin, nil
}

// Proc is a running example service.
type Proc struct {
	URL string // http://127.0.0.1:PORT
	// GRPCAddr is grpc-go's address (127.0.0.1:PORT) when the process
	// printed "grpc listening on ADDR" before its URL (-framework grpc).
	GRPCAddr string
	cmd      *exec.Cmd
	done     chan struct{}
	exit     error       // cmd.Wait's, once done is closed
	lines    chan string // stdout after the "listening on" line
}

// Start runs bin with args plus "-addr 127.0.0.1:0" unless args set -addr,
// and waits up to 30s for its "listening on" line (its first line that has
// "listening on " followed by an http:// URL). The service's logs (its stderr) go
// to logs; its later stdout lines to Line.
func Start(bin string, logs io.Writer, args ...string) (*Proc, error) {
	if !strings.Contains(strings.Join(args, " "), "-addr") {
		args = append(args, "-addr", "127.0.0.1:0")
	}
	cmd := exec.Command(bin, args...)
	cmd.Stderr = logs
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Proc{cmd: cmd, done: make(chan struct{}), lines: make(chan string, 64)}
	url := make(chan string, 1)
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(out)
		listening := false
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "grpc listening on "); ok && !listening {
				p.GRPCAddr = a // written before url is sent, read after it is received
				continue
			}
			if _, u, ok := strings.Cut(sc.Text(), "listening on "); ok && !listening && strings.HasPrefix(u, "http") {
				listening = true
				url <- u
				continue
			}
			if listening {
				select {
				case p.lines <- sc.Text():
				default: // nobody reads them: drop
				}
			}
		}
	}()
	go func() { p.exit = cmd.Wait(); close(p.done) }()
	select {
	case p.URL = <-url:
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("%s exited before listening", filepath.Base(bin))
	case <-time.After(30 * time.Second):
		p.Kill()
		return nil, fmt.Errorf("%s did not start listening in 30s", filepath.Base(bin))
	}
}

// Stop sends SIGTERM and waits for the process to exit (SIGKILL after 10s).
func (p *Proc) Stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.Kill()
	}
}

// Exit returns how the process exited (nil: status 0), after Stop or Kill.
func (p *Proc) Exit() error {
	<-p.done
	return p.exit
}

// Kill sends SIGKILL (a crash: no deferred code runs) and waits for the exit.
func (p *Proc) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Line waits up to 60s for a stdout line of p (after its "listening on"
// line) that starts with prefix, and returns it; lines before it are
// skipped.
func (p *Proc) Line(prefix string) (string, error) {
	timeout := time.After(60 * time.Second)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				return "", fmt.Errorf("the process exited before printing %q", prefix)
			}
			if strings.HasPrefix(l, prefix) {
				return l, nil
			}
		case <-timeout:
			return "", fmt.Errorf("no line %q in 60s", prefix)
		}
	}
}

// Signal sends sig to the process (SIGUSR1 ends a test hook's pause,
// SIGSTOP and SIGCONT stall and resume it).
func (p *Proc) Signal(sig syscall.Signal) error { return p.cmd.Process.Signal(sig) }
