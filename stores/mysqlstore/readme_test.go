package mysqlstore_test

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/idemkit/idem/stores/mysqlstore"
)

// intWidth matches the display width MariaDB and MySQL 5 show after an
// integer type (bigint(20)), which the DDL does not write.
var intWidth = regexp.MustCompile(`^((?:TINY|SMALL|MEDIUM|BIG)?INT)\(\d+\)`)

// TestReadmeSchema: the README's "Schema" section shows what the store
// creates: its column table names every column of a table EnsureSchema
// created (information_schema.COLUMNS), with its type and nullability, in
// order; and every acquire procedure named in this README and in the
// repository's README (`idem_records_acquire_vN`) is the one EnsureSchema
// creates (table + ProcSuffix, found in information_schema.ROUTINES).
func TestReadmeSchema(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "\n## Schema\n")
	if !ok {
		t.Fatal(`README.md has no "## Schema" section`)
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	var doc []string
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\| `([A-Z0-9()]+)` \\| (yes|no) \\|").FindAllStringSubmatch(sec, -1) {
		doc = append(doc, fmt.Sprintf("%s %s %s", m[1], m[2], m[3]))
	}
	db := newDB(t)
	_, table := newStore(t, db)
	rows, err := db.QueryContext(ctxT(t), `SELECT COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE FROM information_schema.COLUMNS
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION`, table)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rows.Close() }()
	var got []string
	for rows.Next() {
		var col, typ, nullable string
		if err := rows.Scan(&col, &typ, &nullable); err != nil {
			t.Fatal(err)
		}
		typ = intWidth.ReplaceAllString(strings.ToUpper(typ), "$1")
		got = append(got, fmt.Sprintf("%s %s %s", col, typ, map[string]string{"YES": "yes", "NO": "no"}[nullable]))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(doc, got) {
		t.Errorf("README.md's column table (column type null) is\n%s\nEnsureSchema creates\n%s\nmake the table's rows say so", strings.Join(doc, "\n"), strings.Join(got, "\n"))
	}

	var routine string
	if err := db.QueryRowContext(ctxT(t), `SELECT ROUTINE_NAME FROM information_schema.ROUTINES
WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_TYPE = 'PROCEDURE' AND ROUTINE_NAME LIKE ?`, table+"\\_acquire%").Scan(&routine); err != nil {
		t.Fatalf("the acquire procedure of table %s: %v", table, err)
	}
	created := strings.TrimPrefix(routine, table) // the suffix EnsureSchema gave it
	if created != mysqlstore.ProcSuffix {
		t.Fatalf("EnsureSchema created procedure %s, whose suffix is not ProcSuffix %q", routine, mysqlstore.ProcSuffix)
	}
	root, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for doc, text := range map[string]string{"stores/mysqlstore/README.md": string(b), "README.md": string(root)} {
		names := regexp.MustCompile(`idem_records(_acquire_v[0-9]+)`).FindAllStringSubmatch(text, -1)
		if doc == "stores/mysqlstore/README.md" && len(names) == 0 {
			t.Errorf("%s names no acquire procedure", doc)
		}
		for _, m := range names {
			if m[1] != created {
				t.Errorf("%s names the procedure idem_records%s; EnsureSchema creates idem_records%s", doc, m[1], created)
			}
		}
	}
}
