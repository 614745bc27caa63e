package azure_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"testing"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/plugins/objectstore/azure"
	"github.com/stratadb/strata/plugins/objectstore/azure/azuretest"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/objectstore/storetest"
)

// BenchmarkAzurite measures Put and Get of 8 KiB, 1 MiB and 16 MiB objects
// against a local Azurite: the client's overhead plus the emulator's, not
// Azure's.
//
//	go test ./plugins/objectstore/azure/ -run '^$' -bench Azurite -benchtime 20x
func BenchmarkAzurite(b *testing.B) {
	az := azuretest.StartAzurite(b)
	st, err := azure.New(context.Background(), az.Config("bench", "b"), zerolog.Nop())
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	benchStore(b, st)
}

func benchStore(b *testing.B, st objectstore.Store) {
	ctx := context.Background()
	for _, size := range []int64{8 << 10, 1 << 20, 16 << 20} {
		data := storetest.Pattern{Seed: uint64(size)}.Bytes(0, size)
		name := fmt.Sprintf("%dKiB", size>>10)
		b.Run("Put/"+name, func(b *testing.B) {
			b.SetBytes(size)
			for i := 0; b.Loop(); i++ {
				if err := st.Put(ctx, fmt.Sprintf("bench/%s/%d", name, i), bytes.NewReader(data), objectstore.PutOptions{Size: size}); err != nil {
					b.Fatal(err)
				}
			}
		})
		key := "bench/get/" + name
		if err := st.Put(ctx, key, bytes.NewReader(data), objectstore.PutOptions{Size: size}); err != nil {
			b.Fatal(err)
		}
		b.Run("Get/"+name, func(b *testing.B) {
			b.SetBytes(size)
			for b.Loop() {
				rc, err := st.Get(ctx, key)
				if err != nil {
					b.Fatal(err)
				}
				n, err := io.Copy(io.Discard, rc)
				rc.Close()
				if err != nil || n != size {
					b.Fatalf("read %d bytes: %v", n, err)
				}
			}
		})
	}
}
