// Package docs compiles the Go code blocks of the documentation: README.md,
// the modules' READMEs and doc comments. Each block is copied, unchanged,
// between the lines "// doc: <document>" and "// doc end" of a function
// here (its harness: the function declares what the fragment uses) or, for
// imports and top-level declarations, of a file. go vet compiles them in
// make test; tools/release TestDocGoBlocks checks that every block has its
// copy and every copy its block. Nothing here runs.
package docs
