package docs

// doc: stores/mysqlstore/README.md
import (
	"database/sql"

	_ "github.com/go-sql-driver/mysql"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/mysqlstore"
)

// doc end

import (
	"net/http"
	"time"
)

func mysqlstoreSetup() {
	// doc: stores/mysqlstore/README.md
	db, err := sql.Open("mysql", "app:secret@tcp(db:3306)/payments")
	defer db.Close() // yours: the store borrows the *sql.DB and never closes it

	store := mysqlstore.New(db, mysqlstore.WithTable("idem_records"))
	err = store.EnsureSchema(ctx)      // or run store.SchemaSQL() in your migrations
	err = store.StartPurger(time.Hour) // deletes expired rows; store.Close() stops it
	engine, err := idem.New(store)
	// doc end
	_, _ = engine, err
}

func mysqlstoreTx() {
	_ = func(r *http.Request, id string, amount int) int {
		// doc: stores/mysqlstore/README.md
		tx, err := mysqlstore.Tx(r.Context()) // the execution's *sql.Tx, begun on first use
		if err != nil {
			return 500
		}
		_, err = tx.ExecContext(r.Context(), `INSERT INTO payments (id, amount) VALUES (?, ?)`, id, amount)
		if err != nil {
			return 500 // released: the insert is rolled back
		}
		return 201 // stored: the insert commits with the record
		// doc end
	}
}

func mysqlstorePool() {
	var db *sql.DB
	// doc: stores/mysqlstore/README.md
	db.SetMaxOpenConns(32)
	db.SetMaxIdleConns(32) // the same: connections are kept, statements stay prepared
	// doc end
}
