// Package metrics serves a process's Prometheus registry on /metrics (with
// /healthz and Go's profiler, /debug/pprof/, beside it: the listener is
// meant for loopback or an operator network). Registries are created per process and passed down;
// nothing registers into the global default registry.
package metrics

import (
	"context"
	"errors"
	"math"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// NewRegistry returns a registry holding the Go runtime and process collectors.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// HandleProfiler adds Go's profiler (/debug/pprof/: CPU profile, heap,
// goroutines, trace) to mux, for `go tool pprof http://<addr>/debug/pprof/profile`.
func HandleProfiler(mux *http.ServeMux) {
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
}

// Server is a running metrics endpoint.
type Server struct {
	srv  *http.Server
	addr net.Addr
	done chan struct{}
}

// Serve listens on addr (host:port; port 0 picks a free one) and serves reg
// until Close. It returns once the listener is bound.
func Serve(addr string, reg *prometheus.Registry, log zerolog.Logger) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	HandleProfiler(mux)
	s := &Server{
		srv:  &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second},
		addr: ln.Addr(),
		done: make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Msg("metrics server stopped")
		}
	}()
	log.Info().Str("addr", s.addr.String()).Msg("serving /metrics")
	return s, nil
}

// Addr returns the bound address.
func (s *Server) Addr() net.Addr { return s.addr }

// Close stops the server.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	<-s.done
	return err
}

// NewDiskFree returns a gauge of the bytes free (to an unprivileged user)
// on the filesystem that holds dir, read at every scrape, so that an alert
// can fire before a server reports its disk full. It reads NaN when dir
// cannot be examined.
func NewDiskFree(name, help, dir string, labels prometheus.Labels) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, func() float64 {
		var st unix.Statfs_t
		if err := unix.Statfs(dir, &st); err != nil {
			return math.NaN()
		}
		return float64(st.Bavail) * float64(st.Bsize)
	})
}
