package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// TestDemoMySQL runs the demo with -store mysql for one framework, in a
// database of its own (created by the service, dropped here): one charge
// per logical payment, and every charged payment a row of the payments
// table, written through its execution's transaction.
func TestDemoMySQL(t *testing.T) {
	cfg, err := mysql.ParseDSN(mysqlDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	defer db.Close()

	bin := filepath.Join(t.TempDir(), "demo")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "-framework", "gin", "-store", "mysql", "-mysql-dsn", cfg.FormatDSN(), "-charge-latency", "100ms")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("demo: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	out := stdout.String()
	if !strings.HasPrefix(out, "gin, mysql store") || !strings.Contains(out, "OK: one charge per logical payment") {
		t.Fatalf("demo output:\n%s", out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var rows, records, signups int
	if err := db.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM payments), (SELECT count(*) FROM idem_records WHERE state = 2), (SELECT count(*) FROM signups)`).Scan(&rows, &records, &signups); err != nil {
		t.Fatal(err)
	}
	if rows == 0 || records == 0 {
		t.Fatalf("%d payment rows and %d completed records in %s; want both written by the demo", rows, records, cfg.DBName)
	}
	// Two sign-ups, with idem and without, each sent twice: one row each,
	// the second refused by the unique constraint (its 409 in the output).
	if signups != 2 || !strings.Contains(out, "201 ×1, 409 ×1") {
		t.Fatalf("%d rows in signups, want 2 (one per sign-up, each retried once)\n%s", signups, out)
	}
	t.Logf("%d payment rows, %d completed records, %d signups\n%s", rows, records, signups, out)
}

// mysqlDatabase returns the DSN of IDEM_MYSQL_DSN's server (default
// root@tcp(127.0.0.1:3306)/test) with a fresh database name, which the
// example services create; it is dropped at the end of the test.
func mysqlDatabase(t *testing.T) string {
	dsn := os.Getenv("IDEM_MYSQL_DSN")
	if dsn == "" {
		dsn = "root@tcp(127.0.0.1:3306)/test"
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatalf("IDEM_MYSQL_DSN: %v", err)
	}
	admin := cfg.Clone()
	admin.DBName = ""
	conn, err := mysql.NewConnector(admin)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		t.Fatalf("MySQL unreachable at %s (IDEM_MYSQL_DSN): %v", cfg.Addr, err)
	}
	cfg.DBName = "idem_demo_test_" + strings.ToLower(rand.Text()[:10])
	t.Cleanup(func() {
		defer db.Close()
		_, _ = db.Exec("DROP DATABASE IF EXISTS `" + cfg.DBName + "`")
	})
	return cfg.FormatDSN()
}
