package benchmarks

import (
	"context"
	"slices"
	"strconv"
	"testing"

	idem "github.com/idemkit/idem/core"
)

// stepStores are the stores BenchmarkSteps measures: memory, and the
// shared stores a payments service runs on.
var stepStores = []string{"memory", "redis", "postgres"}

// BenchmarkSteps measures an operation (idem.Do) whose function runs 0, 1
// or 3 durable steps (idem.Step, each a no-op returning an int), fresh
// keys, with the store round trips per operation: the cost of a step is
// the difference between steps=N and steps=0 of the same store, measured
// side by side (a step costs 2 round trips, StartStep and FinishStep; a
// handler that uses no step pays nothing).
func BenchmarkSteps(b *testing.B) {
	for _, sc := range storeCases {
		if !slices.Contains(stepStores, sc.name) {
			continue
		}
		b.Run("store="+sc.name, func(b *testing.B) {
			for _, n := range []int{0, 1, 3} {
				b.Run("steps="+strconv.Itoa(n), func(b *testing.B) {
					s, trips := sc.open(b)
					e := newEngine(b, s)
					warm(b, s)
					fn := func(ctx context.Context) (int, error) {
						sum := 0
						for i := range n {
							v, err := idem.Step(ctx, stepNames[i], func(context.Context) (int, error) { return i + 1, nil })
							if err != nil {
								return 0, err
							}
							sum += v
						}
						return sum, nil
					}
					start := count(trips)
					b.ReportAllocs()
					for b.Loop() {
						if _, err := idem.Do(context.Background(), e, idem.Operation{Name: "charge", Key: newKey()}, fn); err != nil {
							b.Fatal(err)
						}
					}
					reportTrips(b, trips, start)
				})
			}
		})
	}
}

var stepNames = [...]string{"charge", "ledger", "receipt"}
