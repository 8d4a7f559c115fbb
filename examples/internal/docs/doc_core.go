package docs

// doc: core/doc.go
import idem "github.com/idemkit/idem/core"

// doc end

func coreImportDoc() {
	_ = idem.ScopedKey
}
