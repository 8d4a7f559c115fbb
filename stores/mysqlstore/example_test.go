package mysqlstore_test

import (
	"context"
	"database/sql"
	"log"
	"net/http"
	"time"

	_ "github.com/go-sql-driver/mysql" // registers the "mysql" driver

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/mysqlstore"
)

// Example keeps the records in the service's own database and writes each
// payment through the execution's transaction, so the payment row and the
// stored response commit together.
func Example() {
	ctx := context.Background()
	db, err := sql.Open("mysql", "app@tcp(127.0.0.1:3306)/payments")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close() // yours: the store borrows the *sql.DB and never closes it

	store := mysqlstore.New(db, mysqlstore.WithTable("idem_records"))
	if err := store.EnsureSchema(ctx); err != nil {
		log.Print(err) // no server here: the example only shows the calls
		return
	}
	if err := store.StartPurger(time.Hour); err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	engine, err := idem.New(store)
	if err != nil {
		log.Fatal(err)
	}
	_ = engine // wrap the handlers with an adapter, e.g. idemhttp.New(engine)

	// In a handler the adapter ran:
	_ = func(w http.ResponseWriter, r *http.Request) {
		tx, err := mysqlstore.Tx(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError) // released: retried later
			return
		}
		if _, err := tx.ExecContext(r.Context(), `INSERT INTO payments (amount) VALUES (?)`, 4200); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError) // released: the insert is rolled back
			return
		}
		w.WriteHeader(http.StatusCreated) // stored: the insert commits with the record
	}
}
