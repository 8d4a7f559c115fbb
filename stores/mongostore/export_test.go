package mongostore

import "time"

// WithDeleteLease sets the least lease of release and purge claims
// (deleteLease, 10s), so that tests of a deleter that died need not wait it.
func WithDeleteLease(d time.Duration) Option { return func(s *Store) { s.deleteLease = d } }
