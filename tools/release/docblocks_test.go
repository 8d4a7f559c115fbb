package main

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/doc/comment"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// docBlock is a Go code block a document shows: a README's ```go block,
// or a Go-parsable code block of a doc comment.
type docBlock struct {
	doc  string // the document, relative to the root: README.md, stores/pgstore/README.md, outbox/doc.go
	line int    // the block's first line in it
	text string // its lines, common indentation removed, each ending in "\n"
}

// docRegion is a compiled copy of a block: the lines of a Go file between
// "// doc: <document>" and "// doc end", common indentation removed.
type docRegion struct {
	doc  string
	file string // relative to the root
	line int
	text string
}

// Region markers of compiled copies.
const (
	regionStart = "// doc: "
	regionEnd   = "// doc end"
)

// TestDocGoBlocks: every Go code block of README.md, of every module's
// README and of every doc comment is compiled in make test. A block is
// compiled when a Go file of a workspace module (go vet compiles every
// one, tests included) holds it verbatim (common indentation aside)
// between the lines "// doc: <document>" and "// doc end": a fragment
// inside a function that declares what it uses (the stated harness), or,
// for a block that starts with its package clause, a whole file from its
// package clause on. Each region must still match a block of its
// document, so that a block changed in the document fails until its
// compiled copy changes with it.
func TestDocGoBlocks(t *testing.T) {
	root := repoRoot(t)
	blocks, regions, files := docBlocksAndRegions(t, root)
	for _, p := range checkDocBlocks(blocks, regions, files) {
		t.Error(p)
	}
}

// TestDocGoBlocksDrift: a block edited in its document, and a region left
// behind, are both reported, with what to do.
func TestDocGoBlocksDrift(t *testing.T) {
	blocks := []docBlock{{doc: "README.md", line: 10, text: "store := memstore.New()\n"}}
	regions := []docRegion{{doc: "README.md", file: "examples/internal/docs/readme.go", line: 20, text: "store := memstore.New(memstore.WithShards(4))\n"}}
	got := checkDocBlocks(blocks, regions, nil)
	if len(got) != 2 || !strings.Contains(got[0], "README.md:10: this Go block is compiled nowhere") ||
		!strings.Contains(got[1], "examples/internal/docs/readme.go:20: this region") {
		t.Fatalf("problems %q; want the block compiled nowhere and the region matching no block", got)
	}
	regions[0].text = blocks[0].text
	if got := checkDocBlocks(blocks, regions, nil); len(got) != 0 {
		t.Fatalf("problems %q for a block and its copy", got)
	}
	// A whole program: a file from its package clause on.
	blocks[0].text = "package main\n\nfunc main() {}\n"
	if got := checkDocBlocks(blocks, nil, map[string]string{"examples/x/main.go": "// Command x.\npackage main\n\nfunc main() {}\n"}); len(got) != 0 {
		t.Fatalf("problems %q for a program and its file", got)
	}
}

// checkDocBlocks returns what is wrong: blocks without a compiled copy,
// regions that copy no block. files maps the compiled files (relative
// paths) to their text, for whole programs.
func checkDocBlocks(blocks []docBlock, regions []docRegion, files map[string]string) []string {
	var problems []string
	used := make([]bool, len(regions))
	for _, b := range blocks {
		found := false
		for i, r := range regions {
			if r.doc == b.doc && r.text == b.text {
				found, used[i] = true, true
			}
		}
		if !found && strings.HasPrefix(b.text, "package ") {
			clause, _, _ := strings.Cut(b.text, "\n")
			for _, src := range files {
				if i := strings.Index("\n"+src, "\n"+clause+"\n"); i >= 0 && src[i:] == b.text {
					found = true
				}
			}
		}
		if !found {
			problems = append(problems, fmt.Sprintf("%s:%d: this Go block is compiled nowhere. Copy it unchanged into a Go file of a workspace module "+
				"(a fragment: into a function of examples/internal/docs/*.go that declares what it uses; webhook, MCP, sqlx and GORM blocks: examples/webhooks, examples/mcp, tests/chaos docblocks_test.go), between the lines %q and %q "+
				"(see CONTRIBUTING.md, \"Code in the docs\"); if you changed the block, change its copy (grep -rn %q) the same way:\n%s",
				b.doc, b.line, regionStart+b.doc, regionEnd, regionStart+b.doc, indent(b.text)))
		}
	}
	for i, r := range regions {
		if !used[i] {
			problems = append(problems, fmt.Sprintf("%s:%d: this region (%s%s) copies no Go block of %s: make it the block's text again, or delete it if the block is gone:\n%s",
				r.file, r.line, regionStart, r.doc, r.doc, indent(r.text)))
		}
	}
	return problems
}

func indent(s string) string {
	return "\t" + strings.ReplaceAll(strings.TrimSuffix(s, "\n"), "\n", "\n\t")
}

// docBlocksAndRegions reads every README's ```go blocks, every doc
// comment's Go blocks and every compiled region and file of the
// workspace's modules.
func docBlocksAndRegions(t *testing.T, root string) ([]docBlock, []docRegion, map[string]string) {
	t.Helper()
	mods, err := workspaceModules(root)
	if err != nil {
		t.Fatal(err)
	}
	var blocks []docBlock
	var regions []docRegion
	files := map[string]string{}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if name := d.Name(); rel != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		switch {
		case d.Name() == "README.md":
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			blocks = append(blocks, markdownGoBlocks(rel, string(b))...)
		case strings.HasSuffix(rel, ".go") && inModule(root, rel, mods):
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			src := string(b)
			if regexp.MustCompile(`(?m)^//go:build ignore$`).MatchString(src) {
				return nil
			}
			files[rel] = src
			rs, err := goRegions(rel, src)
			if err != nil {
				return err
			}
			regions = append(regions, rs...)
			if !strings.HasSuffix(rel, "_test.go") {
				bs, err := commentGoBlocks(rel, src)
				if err != nil {
					return err
				}
				blocks = append(blocks, bs...)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return blocks, regions, files
}

// workspaceModules returns the folders of go.work's modules, relative to
// root: the ones make test vets and tests.
func workspaceModules(root string) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(root, "go.work"))
	if err != nil {
		return nil, err
	}
	var mods []string
	for _, m := range regexp.MustCompile(`(?m)^\s+\./(\S+)$`).FindAllStringSubmatch(string(b), -1) {
		mods = append(mods, m[1])
	}
	if len(mods) == 0 {
		return nil, fmt.Errorf("go.work names no ./module")
	}
	return mods, nil
}

// inModule reports whether the file rel belongs to one of mods (its
// nearest go.mod's folder is one of them).
func inModule(root, rel string, mods []string) bool {
	best := ""
	for _, m := range mods {
		if strings.HasPrefix(rel, m+"/") && len(m) > len(best) {
			best = m
		}
	}
	if best == "" {
		return false
	}
	// a nested module not in go.work between best and the file is not compiled
	for dir := filepath.Dir(rel); dir != best && dir != "."; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(root, dir, "go.mod")); err == nil {
			return false
		}
	}
	return true
}

// markdownGoBlocks returns the ```go blocks of a Markdown document, with
// the indentation of their fence removed (a block in a list item).
func markdownGoBlocks(doc, md string) []docBlock {
	var blocks []docBlock
	var cur *docBlock
	var fence string
	sc := bufio.NewScanner(strings.NewReader(md))
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimLeft(line, " ")
		switch {
		case cur == nil && strings.HasPrefix(trimmed, "```go") && strings.TrimSpace(trimmed[5:]) == "":
			fence = line[:len(line)-len(trimmed)]
			cur = &docBlock{doc: doc, line: n + 1}
		case cur != nil && strings.TrimSpace(line) == "```":
			cur.text = dedent(cur.text)
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.text += strings.TrimPrefix(line, fence) + "\n"
		}
	}
	return blocks
}

// commentGoBlocks returns the code blocks of a Go file's comments that
// parse as Go (a file, declarations or statements); the others (shell
// commands, SQL, tables) are not Go.
func commentGoBlocks(rel, src string) ([]docBlock, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, rel, src, parser.ParseComments)
	if err != nil {
		return nil, err
	}
	var blocks []docBlock
	var p comment.Parser
	for _, g := range f.Comments {
		if !isDocComment(f, g) {
			continue
		}
		text := g.Text()
		doc := p.Parse(text)
		// code blocks in order; find each one's line by its first line
		from := 0
		for _, blk := range doc.Content {
			code, ok := blk.(*comment.Code)
			if !ok || !isGo(code.Text) {
				continue
			}
			first, _, _ := strings.Cut(code.Text, "\n")
			line := fset.Position(g.Pos()).Line
			if i := strings.Index(text[from:], first); i >= 0 {
				line += strings.Count(text[:from+i], "\n")
				from += i + len(first)
			}
			blocks = append(blocks, docBlock{doc: rel, line: line, text: code.Text})
		}
	}
	return blocks, nil
}

// isDocComment reports whether g documents the package or a top-level
// declaration (what go doc shows).
func isDocComment(f *ast.File, g *ast.CommentGroup) bool {
	if f.Doc == g {
		return true
	}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Doc == g {
				return true
			}
		case *ast.GenDecl:
			if d.Doc == g {
				return true
			}
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					if s.Doc == g {
						return true
					}
				case *ast.ValueSpec:
					if s.Doc == g {
						return true
					}
				}
			}
		}
	}
	return false
}

// elided matches a "..." standing for elided statements.
var elided = regexp.MustCompile(`(?m)(^\s*|\{ )\.\.\.( \}|\s*$)`)

// isGo reports whether code parses as a Go file, as declarations or as
// statements.
func isGo(code string) bool {
	// an elided part ("..." alone on its line, or "{ ... }") does not make
	// a block less Go: it must then be written so that it compiles
	code = elided.ReplaceAllString(code, "${1}_ = 0${2}")
	fset := token.NewFileSet()
	for _, src := range []string{code, "package p\n" + code, "package p\nfunc _() {\n" + code + "\n}\n"} {
		if _, err := parser.ParseFile(fset, "", src, parser.SkipObjectResolution); err == nil {
			return true
		}
	}
	return false
}

// goRegions returns a Go file's "// doc: <document>" ... "// doc end"
// regions.
func goRegions(rel, src string) ([]docRegion, error) {
	var regions []docRegion
	var cur *docRegion
	for n, line := range strings.Split(src, "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trimmed, regionStart):
			if cur != nil {
				return nil, fmt.Errorf("%s:%d: %q inside the region opened at line %d", rel, n+1, trimmed, cur.line)
			}
			cur = &docRegion{doc: strings.TrimSpace(strings.TrimPrefix(trimmed, regionStart)), file: rel, line: n + 1}
		case trimmed == regionEnd:
			if cur == nil {
				return nil, fmt.Errorf("%s:%d: %q without a region", rel, n+1, regionEnd)
			}
			cur.text = dedent(cur.text)
			regions = append(regions, *cur)
			cur = nil
		case cur != nil:
			cur.text += line + "\n"
		}
	}
	if cur != nil {
		return nil, fmt.Errorf("%s:%d: region without %q", rel, cur.line, regionEnd)
	}
	return regions, nil
}

// dedent removes the leading tabs and spaces every non-blank line of s
// shares, blank lines at its ends and trailing blanks.
func dedent(s string) string {
	lines := strings.Split(s, "\n")
	for len(lines) > 0 && strings.TrimSpace(lines[0]) == "" {
		lines = lines[1:]
	}
	for len(lines) > 0 && strings.TrimSpace(lines[len(lines)-1]) == "" {
		lines = lines[:len(lines)-1]
	}
	prefix, first := "", true
	for _, l := range lines {
		if strings.TrimSpace(l) == "" {
			continue
		}
		lead := l[:len(l)-len(strings.TrimLeft(l, " \t"))]
		if first {
			prefix, first = lead, false
		}
		for !strings.HasPrefix(lead, prefix) {
			prefix = prefix[:len(prefix)-1]
		}
	}
	var b strings.Builder
	for _, l := range lines {
		b.WriteString(strings.TrimRight(strings.TrimPrefix(l, prefix), " \t") + "\n")
	}
	return b.String()
}
