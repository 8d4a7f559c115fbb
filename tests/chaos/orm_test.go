package chaos

import (
	"context"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/mysqlstore"
)

// TestTransactionalSQLXAndGORM: handlers on sqlx or GORM write through
// the execution's *sql.Tx: a sqlx.Tx literal wraps it, and GORM takes it as its
// connection pool (gorm.io/driver/mysql Config.Conn). Both writes commit
// with the record; a 5xx rolls both back.
func TestTransactionalSQLXAndGORM(t *testing.T) {
	t.Parallel()
	_, db := mysqlServer(t)
	ctx0, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := mysqlstore.New(db)
	if err := s.EnsureSchema(ctx0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	payments := "orm_payments"
	if _, err := db.ExecContext(ctx0, "CREATE TABLE `"+payments+"` (id BIGINT AUTO_INCREMENT PRIMARY KEY, idem_key VARCHAR(255) NOT NULL, amount INT NOT NULL) ENGINE=InnoDB"); err != nil {
		t.Fatal(err)
	}
	xdb := sqlx.NewDb(db, "mysql") // the service's sqlx handle on the store's *sql.DB
	e, err := idem.New(s)
	if err != nil {
		t.Fatal(err)
	}
	type payment struct {
		ID      int64
		IdemKey string
		Amount  int
	}
	run := func(key string, status int) {
		t.Helper()
		x, _ := e.Begin(ctx0, &idem.Request{Method: "POST", Path: "/v1/payments", ContentType: "application/json",
			Keys: []string{key}, Principal: "alice", Body: []byte(`{"amount":1}`)})
		ctx := x.WithInfo(ctx0)
		tx, err := mysqlstore.Tx(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// sqlx: wrap the transaction with the mapper of the service's
		// *sqlx.DB (no driver name: sqlx keeps MySQL's ? placeholders).
		xtx := &sqlx.Tx{Tx: tx, Mapper: xdb.Mapper}
		if _, err := xtx.NamedExecContext(ctx, "INSERT INTO `"+payments+"` (idem_key, amount) VALUES (:idem_key, :amount)",
			map[string]any{"idem_key": key, "amount": 1}); err != nil {
			t.Fatal(err)
		}
		// GORM: the transaction is the connection pool of a session.
		g, err := gorm.Open(gormmysql.New(gormmysql.Config{Conn: tx, SkipInitializeWithVersion: true}),
			&gorm.Config{Logger: logger.Discard, SkipDefaultTransaction: true})
		if err != nil {
			t.Fatal(err)
		}
		if err := g.WithContext(ctx).Table(payments).Create(&payment{IdemKey: key, Amount: 2}).Error; err != nil {
			t.Fatal(err)
		}
		var n int
		if err := xtx.GetContext(ctx, &n, "SELECT count(*) FROM `"+payments+"` WHERE idem_key = ?", key); err != nil || n != 2 {
			t.Fatalf("inside the transaction: %d rows, %v; want sqlx's and GORM's", n, err)
		}
		x.Write([]byte("ok"))
		x.Finish(status, nil)
	}
	run("stored", 201)
	run("released", 500)
	for key, want := range map[string]int{"stored": 2, "released": 0} {
		var n int
		if err := db.QueryRowContext(ctx0, "SELECT count(*) FROM `"+payments+"` WHERE idem_key = ?", key).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != want {
			t.Fatalf("%d rows for the %s execution; want %d", n, key, want)
		}
	}
}
