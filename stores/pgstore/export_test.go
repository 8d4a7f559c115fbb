package pgstore

// PurgeSQL exposes the purge statement to the tests, to check its plan.
func PurgeSQL(s *Store) string { return s.q.purge }
