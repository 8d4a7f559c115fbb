package redisstore

// MaxFlushes returns s's flush slots, for the tests that hold every one.
func MaxFlushes(s *Store) int { return s.b.max }

// Queued returns how many commands wait in s's batch queue.
func Queued(s *Store) int {
	if s.b == nil {
		return 0
	}
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	return len(s.b.queue)
}
