// Package gcstest runs a GCS emulator for tests: fsouza/fake-gcs-server's
// fakestorage package, in this process, serving HTTP on a free 127.0.0.1
// port with an in-memory backend.
//
//	f := gcstest.StartFakeGCS(t)
//	f.SetEnv(t) // STORAGE_EMULATOR_HOST, so the client needs no credentials
//	st, err := gcs.New(ctx, f.Config("bucket", "prefix"), log)
//
// The server is stopped when t ends. Objects live in this process's memory,
// so a test of streaming memory use cannot run against it.
package gcstest

import (
	"net"
	"strconv"
	"testing"

	"github.com/fsouza/fake-gcs-server/fakestorage"

	"github.com/stratadb/strata/plugins/objectstore/gcs"
)

// FakeGCS is a running fake-gcs-server.
type FakeGCS struct {
	// Host is the emulator's host:port, the value of STORAGE_EMULATOR_HOST.
	Host string
	// Server is the emulator itself (for inspecting its backend).
	Server *fakestorage.Server
}

// StartFakeGCS starts the emulator for the duration of t.
func StartFakeGCS(t testing.TB) *FakeGCS {
	t.Helper()
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		port, err := freePort()
		if err != nil {
			t.Fatalf("finding a free port: %v", err)
		}
		host := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		srv, err := fakestorage.NewServerWithOptions(fakestorage.Options{
			Scheme:      "http",
			Host:        "127.0.0.1",
			Port:        uint16(port),
			PublicHost:  host,
			ExternalURL: "http://" + host,
			NoListener:  false,
		})
		if err != nil {
			lastErr = err // the port was taken in between
			continue
		}
		t.Cleanup(srv.Stop)
		return &FakeGCS{Host: host, Server: srv}
	}
	t.Fatalf("starting fake-gcs-server: %v", lastErr)
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// SetEnv sets STORAGE_EMULATOR_HOST for the duration of t (t.Setenv), which
// points the GCS client at the emulator without credentials.
func (f *FakeGCS) SetEnv(t testing.TB) {
	t.Helper()
	t.Setenv("STORAGE_EMULATOR_HOST", f.Host)
}

// Config returns a gcs.Config for bucket (created by New when missing) and
// prefix. It relies on SetEnv for the endpoint.
func (f *FakeGCS) Config(bucket, prefix string) gcs.Config {
	return gcs.Config{
		Bucket:       bucket,
		Prefix:       prefix,
		CreateBucket: true,
		ProjectID:    "strata-test",
	}
}
