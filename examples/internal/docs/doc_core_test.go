package docs

// doc: core/doc.go
import idem "github.com/idemkit/idem/core"

// doc end

func Example_coreImportDoc() {
	_ = idem.ScopedKey
}
