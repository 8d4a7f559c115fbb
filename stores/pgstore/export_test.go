package pgstore

// PurgeSQL exposes the purge statement to the tests, to check its plan.
func PurgeSQL(s *Store) string { return s.q.purge }

// FreeSQL exposes the statement freeing tombstones' responses, to check its plan.
func FreeSQL(s *Store) string { return s.q.free }
