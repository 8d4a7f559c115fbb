// Command load is idem's load benchmark over real sockets (`make
// bench-load`): for each service of services (Gin and Fiber v2; no
// idempotency, idem on memory, Redis and PostgreSQL, each peer on its
// stores) it starts the payments service as a process of its own, attacks
// it with vegeta (as a library) at fixed concurrency levels with a mix of
// fresh requests, duplicates and replays, and writes one benchmark line per
// service and level and round (throughput, p50, p99, errors, 409s, keys
// executed twice) for benchmarks/cmd/report, which takes the medians.
//
//	go build -o /tmp/load ./cmd/load && /tmp/load -out results/load.txt
//
// On 2 cores the generator and the server must not starve each other: by
// default (-pin) the command re-executes itself on CPU 1 (taskset -c 1,
// GOMAXPROCS=1) and starts every server on CPU 0 (taskset -c 0,
// GOMAXPROCS=1). Redis and PostgreSQL are shared servers this command does
// not own: they run wherever the kernel puts them, so their CPU comes out
// of both halves. Each level runs for -duration at closed-loop max rate:
// exactly -levels workers each with one request outstanding, so the
// generator's offered load is bounded by the server's answers (no
// open-loop queueing).
//
// With -serve it is the server of one service instead (used by the
// driver): it prints "listening on URL" and serves until SIGTERM.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	_ "net/http/pprof" // -serve -pprof
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/idemkit/idem/benchmarks/internal/payments"
)

func main() {
	var (
		serveMode = flag.Bool("serve", false, "serve one service (fw, lib, store) instead of driving the load")
		fw        = flag.String("fw", "gin", "-serve: framework, gin or fiber")
		lib       = flag.String("lib", "idem", "-serve: none, idem, floor (Gin) or builtin (Fiber)")
		store     = flag.String("store", "memory", "-serve: memory, redis or postgres")
		addr      = flag.String("addr", "127.0.0.1:0", "-serve: listen address")
		out       = flag.String("out", "results/load.txt", "benchmark lines are written here")
		levels    = flag.String("levels", "8,64,256", "comma-separated concurrency levels (workers, one request outstanding each)")
		duration  = flag.Duration("duration", 2*time.Second, "attack time per service and level")
		count     = flag.Int("count", 3, "rounds over every service; the report takes the median of the rounds")
		only      = flag.String("only", "", "run only the services whose name (fw=…/lib=…/store=…) contains one of these comma-separated strings")
		pin       = flag.Bool("pin", true, "pin the generator to CPU 1 and each server to CPU 0 (taskset), GOMAXPROCS=1 each")
		cpuprof   = flag.String("cpuprofile", "", "-serve: write the server's CPU profile here")
		pprofAddr = flag.String("pprof", "", "-serve: serve net/http/pprof at this address (e.g. 127.0.0.1:6060), with block and mutex profiling on")
		conns     = flag.Int("sqlconns", sqlConns, "connection pool size of the PostgreSQL and MySQL stores (0: the driver's default)")
		target    = flag.String("url", "", "attack the service already serving at this URL (e.g. one started with -serve -cpuprofile) instead of starting each")
	)
	flag.Parse()
	sqlConns = *conns
	if *serveMode {
		if err := serveMain(service{fw: *fw, lib: *lib, store: *store}, *addr, *cpuprof, *pprofAddr); err != nil {
			log.Fatal(err)
		}
		return
	}
	if *pin && os.Getenv("IDEM_LOAD_PINNED") == "" {
		os.Exit(repin())
	}
	var lv []int
	for _, f := range strings.Split(*levels, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			log.Fatalf("-levels: %q is not a positive number", f)
		}
		lv = append(lv, n)
	}
	if *target != "" {
		for _, c := range lv {
			line, err := attackLine(*target, 0, "BenchmarkLoad/url/c="+strconv.Itoa(c), c, *duration)
			if err != nil {
				log.Fatal(err)
			}
			fmt.Println(line)
		}
		return
	}
	if err := drive(*out, lv, *duration, *count, *only, *pin); err != nil {
		log.Fatal(err)
	}
}

// repin runs this command again on CPU 1 with GOMAXPROCS=1 and returns its
// exit code.
func repin() int {
	self, err := os.Executable()
	if err != nil {
		log.Fatal(err)
	}
	cmd := exec.Command("taskset", append([]string{"-c", "1", self}, os.Args[1:]...)...)
	cmd.Env = append(os.Environ(), "IDEM_LOAD_PINNED=1", "GOMAXPROCS=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return exit.ExitCode()
		}
		log.Fatalf("taskset (util-linux) is needed for -pin: %v", err)
	}
	return 0
}

// serveMain serves s on addr until SIGTERM or SIGINT, with a CPU profile
// written to cpuprof if it is not empty, and net/http/pprof (block and
// mutex profiles on) at pprofAddr if it is not empty.
func serveMain(s service, addr, cpuprof, pprofAddr string) error {
	if pprofAddr != "" {
		runtime.SetBlockProfileRate(int(10 * time.Microsecond))
		runtime.SetMutexProfileFraction(10)
		pln, err := net.Listen("tcp", pprofAddr)
		if err != nil {
			return err
		}
		defer pln.Close()
		go func() { _ = http.Serve(pln, nil) }() // nil: DefaultServeMux, where net/http/pprof registers
	}
	if cpuprof != "" {
		f, err := os.Create(cpuprof)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv, err := serve(ctx, s, ln)
	if err != nil {
		ln.Close()
		return err
	}
	fmt.Println(payments.ListeningPrefix + srv.url)
	<-ctx.Done()
	return srv.shutdown()
}

// drive runs every service at every level, count rounds, and writes the
// benchmark lines. Each round goes over every service, so that a drift of
// the machine's load reaches all of them alike, starting one place further
// along the list each round (round r starts at service r×n/count of n):
// no service always runs first, or always right after the same one.
func drive(out string, levels []int, d time.Duration, count int, only string, pin bool) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	pinning := "none (-pin=false): generator and servers share both CPUs"
	if pin {
		pinning = "generator on CPU 1, server on CPU 0 (taskset), GOMAXPROCS=1 each; Redis, PostgreSQL and MySQL unpinned"
	}
	fmt.Fprintf(f, "loadrun-date: %s\nloadrun-pinning: %s\nloadrun-levels: %s workers x %s each, %d rounds (medians), closed loop, the services' order rotated each round\nloadrun-mix: %s\nloadrun-sqlconns: %d\nloadrun-start: %s\n",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), pinning, strings.Trim(fmt.Sprint(levels), "[]"), d, count, mixText, sqlConns, loadavg())
	var run []service
	for _, s := range services {
		if only == "" || slices.ContainsFunc(strings.Split(only, ","), func(o string) bool { return strings.Contains(s.String(), o) }) {
			run = append(run, s)
		}
	}
	for round := range count {
		start := round * len(run) / max(count, 1)
		for i := range run {
			s := run[(start+i)%len(run)]
			lines, err := runService(self, s, levels, d, pin)
			if err != nil {
				return fmt.Errorf("%s: %w", s, err)
			}
			for _, l := range lines {
				fmt.Println(l)
				fmt.Fprintln(f, l)
			}
		}
	}
	fmt.Fprintf(f, "loadrun-end: %s\n", loadavg())
	return f.Close()
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.Join(strings.Fields(string(b))[:min(3, len(strings.Fields(string(b))))], " ")
}

// runService starts s as a process of binary bin (this command with
// -serve) and attacks it at each level.
func runService(bin string, s service, levels []int, d time.Duration, pin bool) ([]string, error) {
	args := []string{"-serve", "-fw", s.fw, "-lib", s.lib, "-store", s.store, "-sqlconns", strconv.Itoa(sqlConns)}
	name, env := bin, os.Environ()
	if pin {
		name, args = "taskset", append([]string{"-c", "0", bin}, args...)
		env = append(env, "GOMAXPROCS=1")
	}
	cmd := exec.Command(name, args...)
	cmd.Env = env
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan struct{}) // closed when the process has exited
	var waitErr error
	urls := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if u, ok := strings.CutPrefix(sc.Text(), payments.ListeningPrefix); ok {
				select {
				case urls <- u:
				default:
				}
			}
		}
	}()
	go func() { waitErr = cmd.Wait(); close(done) }()
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}
	var url string
	select {
	case url = <-urls:
	case <-done:
		return nil, fmt.Errorf("server exited before listening: %w", waitErr)
	case <-time.After(30 * time.Second):
		stop()
		return nil, errors.New("server did not listen within 30s")
	}
	defer stop()
	var lines []string
	for _, c := range levels {
		line, err := attackLine(url, cmd.Process.Pid, "BenchmarkLoad/"+s.String()+"/c="+strconv.Itoa(c), c, d)
		if err != nil {
			return nil, err
		}
		lines = append(lines, line)
	}
	return lines, nil
}

// attackLine attacks the service at url with c workers for d and returns
// the benchmark line, with the executions its GET /stats counted meanwhile
// and, when pid > 0 (the server's process), the CPU time the server
// process used meanwhile.
func attackLine(url string, pid int, name string, c int, d time.Duration) (string, error) {
	before, err := getStats(url)
	if err != nil {
		return "", err
	}
	cpu0 := procCPU(pid)
	r := attack(url, c, d, 0)
	cpu1 := procCPU(pid)
	after, err := getStats(url)
	if err != nil {
		return "", err
	}
	if cpu0 >= 0 && cpu1 >= 0 && r.requests > 0 {
		r.cpuPerReq = (cpu1 - cpu0) / time.Duration(r.requests)
	}
	r.keysTwice = after.KeysTwice - before.KeysTwice
	r.executions = after.Executions - before.Executions
	return r.line(name), nil
}

// getStats reads the service's GET /stats.
func getStats(url string) (payments.Stats, error) {
	resp, err := http.Get(url + payments.StatsRoute)
	if err != nil {
		return payments.Stats{}, err
	}
	defer resp.Body.Close()
	var st payments.Stats
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return st, fmt.Errorf("GET /stats: %s %s", resp.Status, b)
	}
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// line renders r as a benchmark line cmd/report reads.
func (r result) line(name string) string {
	cpu := ""
	if r.cpuPerReq > 0 {
		cpu = fmt.Sprintf(" %d server-cpu-ns/req", r.cpuPerReq.Nanoseconds())
	}
	return fmt.Sprintf("%s %d %.0f req/s %d p50-ns %d p99-ns %d errors %d conflicts %d duplicates %d replays %d executions %d keys-executed-twice%s",
		name, r.requests, r.rps, r.p50.Nanoseconds(), r.p99.Nanoseconds(), r.errors, r.conflicts, r.duplicates, r.replays, r.executions, r.keysTwice, cpu)
}

// userHz is the unit of the CPU times in /proc/<pid>/stat: USER_HZ, 100
// on every Linux architecture's user ABI.
const userHz = 100

// procCPU returns the user+system CPU time process pid used so far (all
// its threads, from /proc/<pid>/stat), or -1 when pid <= 0 or it cannot
// be read (not Linux).
func procCPU(pid int) time.Duration {
	if pid <= 0 {
		return -1
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return -1
	}
	// The command name (field 2) is in parentheses and may hold spaces:
	// the fields after its closing parenthesis start at field 3 (state);
	// utime and stime are fields 14 and 15.
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b)[i+1:])
	if i < 0 || len(f) < 13 {
		return -1
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return -1
	}
	return time.Duration(ut+st) * time.Second / userHz
}

// sortedCodes is for messages.
func sortedCodes(m map[string]int) string {
	var ks []string
	for k, v := range m {
		ks = append(ks, fmt.Sprintf("%s:%d", k, v))
	}
	slices.Sort(ks)
	return strings.Join(ks, " ")
}
