package lfc

import (
	"sync"
	"unsafe"

	"github.com/stratadb/strata/sdk/pg"
)

// directAlign is the buffer alignment O_DIRECT needs (the logical block
// size of any disk strata runs on divides it).
const directAlign = 4096

// alignedBuf returns n bytes starting at a directAlign boundary.
func alignedBuf(n int) []byte {
	b := make([]byte, n+directAlign)
	off := 0
	if r := int(uintptr(unsafe.Pointer(&b[0])) % directAlign); r != 0 {
		off = directAlign - r
	}
	return b[off : off+n : off+n]
}

// pagePool holds aligned page buffers for the disk tier's direct I/O.
var pagePool = sync.Pool{New: func() any { b := alignedBuf(pg.BlockSize); return &b }}

func getAligned() []byte  { return *(pagePool.Get().(*[]byte)) }
func putAligned(b []byte) { pagePool.Put(&b) }
