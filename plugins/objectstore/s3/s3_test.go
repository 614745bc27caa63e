package s3_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/plugins/objectstore/s3"
	"github.com/stratadb/strata/plugins/objectstore/s3/s3test"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/objectstore/storetest"
)

func testLogger(t *testing.T) zerolog.Logger {
	if testing.Verbose() {
		return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.DebugLevel)
	}
	return zerolog.Nop()
}

func testLoggerB(b *testing.B) zerolog.Logger { return zerolog.Nop() }

func TestConfigValidate(t *testing.T) {
	good := s3.Config{Bucket: "b", Prefix: "strata/prod/", Endpoint: "http://127.0.0.1:9000", PathStyle: true}
	if err := good.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	cases := []struct {
		mut  func(*s3.Config)
		want string
	}{
		{func(c *s3.Config) { c.Bucket = "" }, "s3.bucket: required"},
		{func(c *s3.Config) { c.Bucket = "a/b" }, "s3.bucket:"},
		{func(c *s3.Config) { c.Prefix = "/abs" }, "s3.prefix:"},
		{func(c *s3.Config) { c.Prefix = "a//b" }, "s3.prefix:"},
		{func(c *s3.Config) { c.Endpoint = "127.0.0.1:9000" }, "s3.endpoint:"},
		{func(c *s3.Config) { c.Endpoint = "ftp://host" }, "s3.endpoint:"},
		{func(c *s3.Config) { c.PartSize = 1 << 20 }, "s3.part_size:"},
		{func(c *s3.Config) { c.MultipartThreshold = -1 }, "s3.multipart_threshold:"},
		{func(c *s3.Config) { c.UploadConcurrency = -2 }, "s3.upload_concurrency:"},
	}
	for _, c := range cases {
		cfg := good
		c.mut(&cfg)
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate(%+v) = %v, want an error containing %q", cfg, err, c.want)
		}
		if _, err := s3.New(context.Background(), cfg, zerolog.Nop()); err == nil {
			t.Errorf("New(%+v) accepted an invalid config", cfg)
		}
	}
}

// gateway starts one versitygw for the test and returns a function that
// opens a store on a fresh prefix of one bucket.
func gateway(t *testing.T, tune func(*s3.Config)) (*s3test.VersityGW, func(t *testing.T) *s3.Store) {
	gw := s3test.StartVersityGW(t)
	gw.SetEnv(t)
	var n atomic.Int64
	return gw, func(t *testing.T) *s3.Store {
		cfg := gw.Config("strata-test", fmt.Sprintf("run/%d", n.Add(1)))
		if tune != nil {
			tune(&cfg)
		}
		st, err := s3.New(context.Background(), cfg, testLogger(t))
		if err != nil {
			t.Fatalf("s3.New: %v", err)
		}
		return st
	}
}

// posixLimited are the acceptance subtests that versitygw's posix backend
// cannot pass, whatever the client does: it stores a key as a file path, so
// a key cannot be both an object and the "directory" of others
// ("a/b" and "a/b/c": 409 ExistingObjectIsDirectory / ObjectParentIsFile),
// and a key segment is limited to 255 bytes (NAME_MAX). The suite runs them
// against gofakes3 instead (TestAcceptanceGoFakeS3), which has a flat
// namespace like S3.
var posixLimited = map[string]bool{
	"TestAcceptance/ValidKeys":       true,
	"TestAcceptance/KeyIsAlsoPrefix": true,
	"TestAcceptance/ListOrder":       true,
	// Random operations against the reference store; they make keys that
	// are prefixes of others.
	"TestAcceptance/MatchesReference": true,
}

// TestAcceptance runs the objectstore acceptance suite against versitygw.
func TestAcceptance(t *testing.T) {
	_, open := gateway(t, nil)
	storetest.RunOptions(t, func(t *testing.T) objectstore.Store {
		if posixLimited[t.Name()] {
			t.Skip("versitygw's posix backend keeps keys as file paths (no key that is also a prefix, 255-byte segments); covered by TestAcceptanceGoFakeS3")
		}
		return open(t)
	}, storetest.Options{
		// Buffers: (UploadConcurrency+1) parts of 16 MiB for a Put; the
		// 256 MiB object must not be held in memory.
		BigHeapLimit: 128 << 20,
	})
}

// TestMultipart drives the multipart path with small parts: known and
// unknown sizes, conditional creates decided at CompleteMultipartUpload,
// and a failed upload that must leave neither an object nor an open
// multipart upload behind.
func TestMultipart(t *testing.T) {
	gw, open := gateway(t, func(c *s3.Config) {
		c.MultipartThreshold = 5 << 20
		c.PartSize = 5 << 20
		c.UploadConcurrency = 2
	})
	st := open(t)
	defer st.Close()
	// Three parts, the last one short; the failing body dies after two.
	storetest.RunMultipart(t, st, storetest.MultipartOptions{Prefix: "mp", Size: 12<<20 + 17, FailAfter: 11 << 20})
	// None of the failed Puts left a multipart upload open.
	uploads := listUploads(t, gw.Endpoint, st)
	if len(uploads) != 0 {
		t.Fatalf("failed Puts left %d multipart uploads open: %q", len(uploads), uploads)
	}
}

// listUploads lists the open multipart uploads under the store's prefix
// with a plain SDK client.
func listUploads(t *testing.T, endpoint string, st *s3.Store) []string {
	t.Helper()
	cfg, err := awsconfig.LoadDefaultConfig(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	client := awss3.NewFromConfig(cfg, func(o *awss3.Options) {
		o.BaseEndpoint = aws.String(endpoint)
		o.UsePathStyle = true
	})
	out, err := client.ListMultipartUploads(context.Background(), &awss3.ListMultipartUploadsInput{
		Bucket: aws.String(st.Bucket()), Prefix: aws.String(st.Prefix()),
	})
	if err != nil {
		t.Fatalf("ListMultipartUploads: %v", err)
	}
	var keys []string
	for _, u := range out.Uploads {
		keys = append(keys, aws.ToString(u.Key))
	}
	return keys
}

// TestPrefixIsolation: stores on prefixes "iso/a" and "iso/ab" of one bucket
// see only their own objects, and a key near the length limit counts the
// prefix.
func TestPrefixIsolation(t *testing.T) {
	gw := s3test.StartVersityGW(t)
	gw.SetEnv(t)
	ctx := context.Background()
	open := func(prefix string) *s3.Store {
		st, err := s3.New(ctx, gw.Config("iso-bucket", prefix), testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	a, ab, root := open("iso/a/"), open("iso/ab"), open("")
	for _, st := range []*s3.Store{a, ab} {
		if err := st.Put(ctx, "k", strings.NewReader(st.Prefix()), objectstore.PutOptions{Size: int64(len(st.Prefix()))}); err != nil {
			t.Fatal(err)
		}
	}
	for _, st := range []*s3.Store{a, ab} {
		var keys []string
		if err := st.List(ctx, "", func(oi objectstore.ObjectInfo) error { keys = append(keys, oi.Key); return nil }); err != nil {
			t.Fatal(err)
		}
		if len(keys) != 1 || keys[0] != "k" {
			t.Fatalf("store %q lists %q, want [k]", st.Prefix(), keys)
		}
		if got := storetest.ReadAll(t, st, "k"); string(got) != st.Prefix() {
			t.Fatalf("store %q reads %q", st.Prefix(), got)
		}
		// A length that would overflow off+length reads to the end.
		rc, err := st.GetRange(ctx, "k", 1, math.MaxInt64)
		if err != nil {
			t.Fatalf("GetRange(k, 1, MaxInt64): %v", err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || string(got) != st.Prefix()[1:] {
			t.Fatalf("GetRange(k, 1, MaxInt64) = %q, %v; want %q", got, err, st.Prefix()[1:])
		}
	}
	var keys []string
	if err := root.List(ctx, "iso/", func(oi objectstore.ObjectInfo) error { keys = append(keys, oi.Key); return nil }); err != nil {
		t.Fatal(err)
	}
	if strings.Join(keys, ",") != "iso/a/k,iso/ab/k" {
		t.Fatalf("root store lists %q, want [iso/a/k iso/ab/k]", keys)
	}
	long := strings.Repeat("x", objectstore.MaxKeyLen-len("iso/a/")+1)
	err := a.Put(ctx, long, strings.NewReader("x"), objectstore.PutOptions{Size: 1})
	if !errors.Is(err, objectstore.ErrInvalidKey) {
		t.Fatalf("Put of a key that is too long with the prefix: %v, want ErrInvalidKey", err)
	}
}

// fakeS3 answers every request with the next scripted response, so that
// the error mapping can be checked exactly.
type fakeS3 struct {
	mu   sync.Mutex
	resp map[string][]fakeResp // by "METHOD" (HEAD, GET, PUT)
	seen []string
}

type fakeResp struct {
	status int
	code   string
}

func (f *fakeS3) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	f.mu.Lock()
	f.seen = append(f.seen, r.Method+" "+r.Header.Get("If-None-Match"))
	q := f.resp[r.Method]
	var fr fakeResp
	if len(q) > 0 {
		fr = q[0]
		if len(q) > 1 {
			f.resp[r.Method] = q[1:]
		}
	}
	f.mu.Unlock()
	if fr.status == 0 {
		fr.status = 200
	}
	if fr.status == 200 {
		w.Header().Set("Content-Length", "3")
		w.Header().Set("ETag", `"abc"`)
		w.WriteHeader(200)
		if r.Method == http.MethodGet {
			w.Write([]byte("abc"))
		}
		return
	}
	w.Header().Set("Content-Type", "application/xml")
	w.WriteHeader(fr.status)
	if r.Method != http.MethodHead {
		fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>%s</Code><Message>scripted</Message></Error>`, fr.code)
	}
}

// TestNoCredentials: without credentials anywhere, New says what to set
// instead of leaving the first request to fail. The metadata service is
// off, so the test stays on this machine.
func TestNoCredentials(t *testing.T) {
	for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
		"AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("AWS_CONFIG_FILE", os.DevNull)
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", os.DevNull)
	_, err := s3.New(context.Background(), s3.Config{Bucket: "b", Endpoint: "http://127.0.0.1:1", PathStyle: true, Region: "us-east-1"}, zerolog.Nop())
	if err == nil || !strings.Contains(err.Error(), "no AWS credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY") {
		t.Fatalf("New without credentials: %v", err)
	}
	t.Setenv("AWS_ACCESS_KEY_ID", "fake")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "fake")
	st, err := s3.New(context.Background(), s3.Config{Bucket: "b", Endpoint: "http://127.0.0.1:1", PathStyle: true, Region: "us-east-1"}, zerolog.Nop())
	if err != nil {
		t.Fatalf("New with credentials in the environment: %v", err)
	}
	st.Close()
}

func TestErrorMapping(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "fake")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "fake")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("AWS_MAX_ATTEMPTS", "1") // no SDK retries: one scripted answer per call
	t.Setenv("AWS_CONFIG_FILE", os.DevNull)
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", os.DevNull)
	f := &fakeS3{}
	srv := httptest.NewServer(f)
	defer srv.Close()
	ctx := context.Background()
	st, err := s3.New(ctx, s3.Config{Bucket: "b", Endpoint: srv.URL, PathStyle: true, Region: "us-east-1"}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	script := func(method string, rs ...fakeResp) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.resp = map[string][]fakeResp{method: rs}
	}
	putIfNotExists := func() error {
		return st.Put(ctx, "k", strings.NewReader("abc"), objectstore.PutOptions{Size: 3, IfNotExists: true})
	}
	getErr := func() error {
		rc, err := st.Get(ctx, "k")
		if err == nil {
			rc.Close()
		}
		return err
	}
	cases := []struct {
		name    string
		method  string
		resp    []fakeResp
		call    func() error
		want    error
		notWant error
	}{
		{"412 on conditional put", "PUT", []fakeResp{{412, "PreconditionFailed"}}, putIfNotExists, objectstore.ErrExists, objectstore.ErrTransient},
		{"503 SlowDown", "PUT", []fakeResp{{503, "SlowDown"}}, putIfNotExists, objectstore.ErrTransient, objectstore.ErrExists},
		{"500 InternalError on get", "GET", []fakeResp{{500, "InternalError"}}, getErr, objectstore.ErrTransient, objectstore.ErrNotFound},
		{"NoSuchKey", "GET", []fakeResp{{404, "NoSuchKey"}}, getErr, objectstore.ErrNotFound, objectstore.ErrTransient},
		{"NoSuchBucket is neither", "GET", []fakeResp{{404, "NoSuchBucket"}}, getErr, nil, objectstore.ErrNotFound},
		{"403 AccessDenied", "GET", []fakeResp{{403, "AccessDenied"}}, getErr, nil, objectstore.ErrTransient},
	}
	for _, c := range cases {
		script(c.method, c.resp...)
		err := c.call()
		if err == nil {
			t.Errorf("%s: no error", c.name)
			continue
		}
		if c.want != nil && !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want it to match %v", c.name, err, c.want)
		}
		if errors.Is(err, c.notWant) {
			t.Errorf("%s: %v, must not match %v", c.name, err, c.notWant)
		}
	}

	// A missing bucket names itself, its endpoint and the way out.
	script("GET", fakeResp{404, "NoSuchBucket"})
	if err := getErr(); err == nil || !strings.Contains(err.Error(), `bucket "b" does not exist at `+srv.URL+" (create it") {
		t.Errorf("NoSuchBucket: %v, want it to name the bucket and the endpoint", err)
	}

	// 409 ConditionalRequestConflict: ErrExists only if the object now
	// exists (HEAD 200), otherwise transient (HEAD 404).
	f.mu.Lock()
	f.resp = map[string][]fakeResp{"PUT": {{409, "ConditionalRequestConflict"}}, "HEAD": {{200, ""}}}
	f.mu.Unlock()
	if err := putIfNotExists(); !errors.Is(err, objectstore.ErrExists) {
		t.Errorf("409 then HEAD 200: %v, want ErrExists", err)
	}
	f.mu.Lock()
	f.resp = map[string][]fakeResp{"PUT": {{409, "ConditionalRequestConflict"}}, "HEAD": {{404, ""}}}
	f.mu.Unlock()
	if err := putIfNotExists(); !objectstore.IsTransient(err) || errors.Is(err, objectstore.ErrExists) {
		t.Errorf("409 then HEAD 404: %v, want a transient error, not ErrExists", err)
	}
	// The conditional create sent If-None-Match: *.
	f.mu.Lock()
	sawINM := false
	for _, s := range f.seen {
		sawINM = sawINM || s == "PUT *"
	}
	f.mu.Unlock()
	if !sawINM {
		t.Errorf("no PUT carried If-None-Match: *; requests: %q", f.seen)
	}

	// A server that is gone: transient.
	srv.Close()
	if err := getErr(); !objectstore.IsTransient(err) {
		t.Errorf("Get from a closed server: %v, want transient", err)
	}
}

// TestAcceptanceGoFakeS3 runs the acceptance suite against gofakes3 in
// process: a flat namespace like S3's, so it covers the key-shape subtests
// that versitygw's posix backend cannot store. It holds objects in memory,
// so its big object is small (8 MiB: it stores at about 5 MiB/s) and the heap is not checked.
func TestAcceptanceGoFakeS3(t *testing.T) {
	srv := httptest.NewServer(gofakes3.New(s3mem.New()).Server())
	defer srv.Close()
	t.Setenv("AWS_ACCESS_KEY_ID", "fake")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "fake")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("AWS_CONFIG_FILE", os.DevNull)
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", os.DevNull)
	// gofakes3 sends the whole object's checksum with a ranged GET (S3 does
	// not), which the SDK's response validation then rejects.
	t.Setenv("AWS_RESPONSE_CHECKSUM_VALIDATION", "when_required")
	var n atomic.Int64
	storetest.RunOptions(t, func(t *testing.T) objectstore.Store {
		st, err := s3.New(context.Background(), s3.Config{
			Bucket: "fake", Prefix: fmt.Sprintf("run/%d", n.Add(1)), Endpoint: srv.URL,
			PathStyle: true, Region: "us-east-1", CreateBucket: true,
		}, testLogger(t))
		if err != nil {
			t.Fatalf("s3.New: %v", err)
		}
		return st
	}, storetest.Options{BigSize: 8 << 20, MaxKeyLen: objectstore.MaxKeyLen - len("run/NN/")})
}
