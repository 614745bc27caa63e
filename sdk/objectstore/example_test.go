package objectstore_test

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/sdk/objectstore"
)

// Wrappers compose: here retries over metrics over a per-tenant prefix of
// one backend (the in-memory store stands in for S3 or the fs store).
func Example() {
	ctx := context.Background()
	backend := objectstore.NewMemory()
	var s objectstore.Store = objectstore.WithPrefix(backend, "tenants/t1")
	s = objectstore.WithMetrics(s, prometheus.NewRegistry(), "memory")
	s = objectstore.WithRetry(s, objectstore.DefaultRetryPolicy(), zerolog.Nop())
	defer s.Close()

	body := "layer bytes"
	// A strings.Reader can seek, so a transiently failed Put is retried.
	if err := s.Put(ctx, "layers/000001", strings.NewReader(body), objectstore.PutOptions{Size: int64(len(body)), IfNotExists: true}); err != nil {
		fmt.Println(err)
	}
	rc, err := s.GetRange(ctx, "layers/000001", 6, -1)
	if err != nil {
		fmt.Println(err)
		return
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	fmt.Printf("%s\n", b)

	_ = backend.List(ctx, "", func(oi objectstore.ObjectInfo) error {
		fmt.Println("backend key:", oi.Key)
		return nil
	})
	_, err = s.Stat(ctx, "layers/000002")
	fmt.Println(err)
	// Output:
	// bytes
	// backend key: tenants/t1/layers/000001
	// memory "tenants/t1/layers/000002": objectstore: object not found
}
