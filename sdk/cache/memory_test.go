package cache_test

import (
	"testing"

	"github.com/stratadb/strata/sdk/cache"
	"github.com/stratadb/strata/sdk/cache/cachetest"
)

func TestMemoryAcceptance(t *testing.T) {
	cachetest.Run(t, func(t *testing.T, capacity int64) cache.Cache {
		c, err := cache.NewMemory(capacity)
		if err != nil {
			t.Fatal(err)
		}
		return c
	})
}
