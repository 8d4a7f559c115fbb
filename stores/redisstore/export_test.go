package redisstore

// MaxFlushes is maxFlushes, for the tests that hold every flush slot.
const MaxFlushes = maxFlushes

// Queued returns how many commands wait in s's batch queue.
func Queued(s *Store) int {
	if s.b == nil {
		return 0
	}
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	return len(s.b.queue)
}
