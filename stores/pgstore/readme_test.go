package pgstore_test

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/idemkit/idem/stores/pgstore"
)

// readmeSection returns the text of README.md from the heading to the next
// heading of its level.
func readmeSection(t *testing.T, heading string) string {
	t.Helper()
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("README.md has no heading %q", heading)
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	return sec
}

// TestReadmeSchema: the README's "Table" section shows what the store
// creates: its SQL block is SchemaSQL() for the default table, and its
// column table names every column of a table EnsureSchema created, with
// its type and nullability (information_schema.columns), in order.
func TestReadmeSchema(t *testing.T) {
	sec := readmeSection(t, "## Table")
	_, sql, _ := strings.Cut(sec, "```sql\n")
	sql, _, _ = strings.Cut(sql, "```")
	if want := pgstore.New(nil).SchemaSQL() + "\n"; sql != want {
		t.Errorf("README.md's Table SQL differs from SchemaSQL(); paste SchemaSQL() for the default table:\n%s", want)
	}
	var doc []string
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\| `([a-z]+)` \\| (yes|no) \\|").FindAllStringSubmatch(sec, -1) {
		doc = append(doc, fmt.Sprintf("%s %s %s", m[1], m[2], m[3]))
	}
	pool := newPool(t)
	_, table := newStore(t, pool)
	schema, name, _ := strings.Cut(table, ".")
	rows, err := pool.Query(ctxT(t), `SELECT column_name, data_type, is_nullable FROM information_schema.columns
WHERE table_schema = $1 AND table_name = $2 ORDER BY ordinal_position`, schema, name)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	// information_schema's data_type for the README's type names
	types := map[string]string{"text": "text", "smallint": "smallint", "integer": "integer", "bigint": "bigint", "bytea": "bytea",
		"jsonb": "jsonb", "timestamp with time zone": "timestamptz"}
	var got []string
	for rows.Next() {
		var col, typ, nullable string
		if err := rows.Scan(&col, &typ, &nullable); err != nil {
			t.Fatal(err)
		}
		null := map[string]string{"YES": "yes", "NO": "no"}[nullable]
		if short, ok := types[typ]; ok {
			typ = short
		}
		got = append(got, fmt.Sprintf("%s %s %s", col, typ, null))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(doc, got) {
		t.Errorf("README.md's column table (column type null) is\n%s\nEnsureSchema creates\n%s\nmake the table's rows say so", strings.Join(doc, "\n"), strings.Join(got, "\n"))
	}
}
