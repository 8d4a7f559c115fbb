package chaos

import (
	"context"
	"database/sql"

	"github.com/jmoiron/sqlx"
	"gorm.io/driver/mysql"
	"gorm.io/gorm"
)

// The sqlx and GORM blocks of stores/mysqlstore/README.md, compiled
// (tools/release TestDocGoBlocks); TestTransactionalSQLXAndGORM runs them.
func Example_mysqlstoreSQLX() {
	var ctx context.Context
	var tx *sql.Tx
	var xdb *sqlx.DB
	var p struct{ ID, Amount int }
	var err error
	// doc: stores/mysqlstore/README.md
	xtx := &sqlx.Tx{Tx: tx, Mapper: xdb.Mapper} // xdb := sqlx.NewDb(db, "mysql"), db given to mysqlstore.New
	_, err = xtx.NamedExecContext(ctx, `INSERT INTO payments (id, amount) VALUES (:id, :amount)`, p)
	// doc end
	_ = err
}

func Example_mysqlstoreGORM() {
	var ctx context.Context
	var tx *sql.Tx
	var payment struct{ ID, Amount int }
	// doc: stores/mysqlstore/README.md
	g, err := gorm.Open(mysql.New(mysql.Config{Conn: tx, SkipInitializeWithVersion: true}),
		&gorm.Config{SkipDefaultTransaction: true})
	err = g.WithContext(ctx).Create(&payment).Error
	// doc end
	_ = err
}
