package mysqlstore

import "context"

// PurgeCounts is s.Purge, also returning how many tombstones' responses it freed.
func PurgeCounts(s *Store, ctx context.Context) (deleted, freed int64, err error) {
	return s.purge(ctx)
}

// ProcVersion is the acquire procedure's COMMENT that EnsureSchema writes.
const ProcVersion = procVersion
