package harness

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Paired runs bm.N ops of a and bm.N ops of b in alternating chunks of 500,
// so that both sides see the same machine load even when it drifts (the
// machine is shared), and reports each side's ns per op
// (<nameA>-ns/op, <nameB>-ns/op), the ratio a ÷ b (<nameA>/<nameB>) and
// each side's heap allocations per op (<nameA>-allocs/op,
// <nameB>-allocs/op: runtime.MemStats.Mallocs around each chunk, outside
// the timed part; whatever else allocates meanwhile counts too). parallel
// > 0 spreads every chunk over that many goroutines. ns/op of the
// benchmark itself covers both sides.
func Paired(bm *testing.B, nameA, nameB string, parallel int, a, b func() error) {
	const chunk = 500
	var ta, tb time.Duration
	var ma, mb uint64
	var ms runtime.MemStats
	mallocs := func() uint64 { runtime.ReadMemStats(&ms); return ms.Mallocs }
	run := func(fn func() error, n int, m *uint64) time.Duration {
		before := mallocs()
		defer func() { *m += mallocs() - before }()
		start := time.Now()
		if parallel <= 0 {
			for range n {
				if err := fn(); err != nil {
					bm.Fatal(err)
				}
			}
			return time.Since(start)
		}
		var wg sync.WaitGroup
		per := (n + parallel - 1) / parallel
		for g := 0; g < parallel; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range per {
					if err := fn(); err != nil {
						bm.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		return time.Since(start)
	}
	bm.ResetTimer()
	for done := 0; done < bm.N; done += chunk {
		n := min(chunk, bm.N-done)
		if (done/chunk)%2 == 0 {
			ta += run(a, n, &ma)
			tb += run(b, n, &mb)
		} else {
			tb += run(b, n, &mb)
			ta += run(a, n, &ma)
		}
	}
	bm.StopTimer()
	bm.ReportMetric(float64(ta)/float64(bm.N), nameA+"-ns/op")
	bm.ReportMetric(float64(tb)/float64(bm.N), nameB+"-ns/op")
	bm.ReportMetric(float64(ta)/float64(tb), nameA+"/"+nameB)
	bm.ReportMetric(float64(ma)/float64(bm.N), nameA+"-allocs/op")
	bm.ReportMetric(float64(mb)/float64(bm.N), nameB+"-allocs/op")
}

// Concurrent duplicates of Duplicates: DupKeys keys, each sent by
// DupCopies goroutines released together.
const (
	DupKeys   = 50
	DupCopies = 20
)

// DupRetryBudget bounds how long Duplicates retries one request, as a
// client would: the longest a key can stay in progress without an
// execution (an acquire that timed out but landed holds the default lease,
// 30s, unless its release lands first), plus a margin for a loaded machine.
const DupRetryBudget = 90 * time.Second

// An Answer is one response to a request of Duplicates: its status and its
// Retry-After header value ("" when absent).
type Answer struct {
	Status     int
	RetryAfter string
}

// RetryDelay reports whether a client retries a: idem's retryable answers,
// 503 store-unavailable and 409 in-progress, both carrying Retry-After in
// whole seconds (a 409 without it, such as operation-uncertain, is final),
// and the delay it asks for.
func (a Answer) RetryDelay() (time.Duration, bool) {
	if a.Status != 503 && a.Status != 409 {
		return 0, false
	}
	s, err := strconv.ParseUint(a.RetryAfter, 10, 16)
	if err != nil {
		return 0, false
	}
	return time.Duration(s) * time.Second, true
}

// DupResult is what one library did with the concurrent duplicates.
type DupResult struct {
	Executions, KeysTwice, MaxPerKey, Missing int
	Status                                    map[int]int // first answers: status code -> count
	Final                                     map[int]int // last answers, after the retries: status code -> count
	Retries                                   int         // requests re-sent after a retryable answer
}

// Duplicates sends DupCopies concurrent copies of each of DupKeys fresh
// keys (all DupKeys*DupCopies goroutines released together), spread round
// robin over the instances' request functions, and counts the handler's
// executions per key (KeyCounts). Each copy is a client: an answer a client
// retries (503 or 409 with Retry-After) is re-sent to the same instance
// after the delay it asks for, for up to DupRetryBudget, so that a machine
// too loaded for the store to answer in time slows the run but does not
// change what is counted.
func Duplicates(dos []func(key string) Answer) DupResult {
	counts := new(sync.Map)
	KeyCounts.Store(counts)
	defer KeyCounts.Store(nil)
	keys := make([]string, DupKeys)
	for i := range keys {
		keys[i] = NewKey()
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	res := DupResult{Status: map[int]int{}, Final: map[int]int{}}
	for _, k := range keys {
		for i := range DupCopies {
			do := dos[i%len(dos)]
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				a := do(k)
				first, retries := a.Status, 0
				for deadline := time.Now().Add(DupRetryBudget); ; retries++ {
					d, ok := a.RetryDelay()
					if !ok || time.Now().Add(d).After(deadline) {
						break
					}
					time.Sleep(d)
					a = do(k)
				}
				mu.Lock()
				res.Status[first]++
				res.Final[a.Status]++
				res.Retries += retries
				mu.Unlock()
			}()
		}
	}
	close(start)
	wg.Wait()
	for _, k := range keys {
		n := int64(0)
		if v, ok := counts.Load(k); ok {
			n = v.(*atomic.Int64).Load()
		}
		res.Executions += int(n)
		res.MaxPerKey = max(res.MaxPerKey, int(n))
		switch {
		case n == 0:
			res.Missing++
		case n > 1:
			res.KeysTwice++
		}
	}
	return res
}

// Line is res as a benchmark line named BenchmarkExecutions/<name>, the
// form cmd/report reads: the counts, the retries and the first answers
// (status-<code>).
func (res DupResult) Line(name string) string {
	codes := make([]int, 0, len(res.Status))
	for c := range res.Status {
		codes = append(codes, c)
	}
	slices.Sort(codes)
	var st strings.Builder
	for _, c := range codes {
		fmt.Fprintf(&st, " %d status-%d", res.Status[c], c)
	}
	return fmt.Sprintf("BenchmarkExecutions/%s 1 %d requests %d keys %d executions %d keys-executed-twice %d max-executions/key %d retries%s",
		name, DupKeys*DupCopies, DupKeys, res.Executions, res.KeysTwice, res.MaxPerKey, res.Retries, st.String())
}

// AppendLines appends lines, one per line, to the file at path (created
// if missing): the -peers.out files of both modules' TestPeersExecutions,
// which cmd/report reads as benchmark lines. An empty path writes nothing.
func AppendLines(path string, lines []string) error {
	if path == "" {
		return nil
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(strings.Join(lines, "\n") + "\n"); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
