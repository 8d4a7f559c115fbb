package docs

// doc: stores/pgstore/README.md
import (
	"github.com/jackc/pgx/v5/pgxpool"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/pgstore"
)

// doc end

import (
	"net/http"
	"time"
)

func pgstoreSetup() {
	// doc: stores/pgstore/README.md
	pool, err := pgxpool.New(ctx, "postgres://app@db:5432/payments")
	defer pool.Close() // yours: the store borrows the pool and never closes it

	store := pgstore.New(pool, pgstore.WithTable("idem_records"))
	err = store.EnsureSchema(ctx)      // or run store.SchemaSQL() in your migrations
	err = store.StartPurger(time.Hour) // deletes expired rows; store.Close() stops it
	engine, err := idem.New(store)
	// doc end
	_, _ = engine, err
}

func pgstoreTx() {
	_ = func(r *http.Request, id string, amount int) int {
		// doc: stores/pgstore/README.md
		tx, err := pgstore.Tx(r.Context()) // the execution's pgx.Tx, begun on first use
		if err != nil {
			return 500
		}
		_, err = tx.Exec(r.Context(), `INSERT INTO payments (id, amount) VALUES ($1, $2)`, id, amount)
		if err != nil {
			return 500 // released: the insert is rolled back
		}
		return 201 // stored: the insert commits with the record
		// doc end
	}
	_ = time.Second
}
