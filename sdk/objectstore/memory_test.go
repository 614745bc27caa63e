package objectstore_test

import (
	"testing"

	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/objectstore/storetest"
)

func TestMemoryAcceptance(t *testing.T) {
	storetest.RunOptions(t, func(t *testing.T) objectstore.Store {
		return objectstore.NewMemory()
	}, storetest.Options{StrictClose: true})
}
