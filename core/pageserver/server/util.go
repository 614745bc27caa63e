package server

import (
	"bufio"
	"io"

	"github.com/stratadb/strata/core/pageserver/keyspace"
)

var relsRange = keyspace.RelsRange

type bufferedChunks struct{ *bufio.Writer }

func newBufferedChunks(w io.Writer) bufferedChunks {
	return bufferedChunks{bufio.NewWriterSize(w, 1<<20)}
}
