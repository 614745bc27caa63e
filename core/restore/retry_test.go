package restore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stratadb/strata/core/pageserver/timeline"
)

// TestAskThroughOutage: a read that meets a pageserver outage (the
// connection refused, the stream cut, redo ingest behind X) is asked
// again, said once per outage, and succeeds when the pageserver answers;
// any other error is returned at once; an outage longer than the limit
// fails saying how long it lasted, and one whose cluster was stopped
// fails at once, saying so.
func TestAskThroughOutage(t *testing.T) {
	ctx := context.Background()
	var said []string
	u := &outages{limit: time.Minute, say: func(s string) { said = append(said, s) }}
	down := []error{
		status.Error(codes.Unavailable, "connection refused"),
		fmt.Errorf("client: GetPages stream: %w", status.Error(codes.Unavailable, "error reading from server: EOF")),
		fmt.Errorf("%w: waiting for 0/5000000", timeline.ErrWaitLSNTimeout),
	}
	calls := 0
	err := u.ask(ctx, func() error {
		calls++
		if calls <= len(down) {
			return down[calls-1]
		}
		return nil
	})
	if err != nil || calls != len(down)+1 {
		t.Fatalf("through an outage of %d failures: %v after %d calls", len(down), err, calls)
	}
	if len(said) != 2 || !strings.Contains(said[0], "does not answer") || !strings.Contains(said[1], "answers again") {
		t.Fatalf("said %q; want one line when it stopped answering and one when it answered again", said)
	}

	calls = 0
	notFound := fmt.Errorf("%w: file base/1/2", timeline.ErrNotFound)
	if err := u.ask(ctx, func() error { calls++; return notFound }); !errors.Is(err, timeline.ErrNotFound) || calls != 1 {
		t.Fatalf("a failed read: %v after %d calls; want it at once", err, calls)
	}
	if err := (*outages)(nil).ask(ctx, func() error { calls++; return down[0] }); status.Code(err) != codes.Unavailable || calls != 2 {
		t.Fatalf("without outages: %v after %d calls; want one call", err, calls)
	}

	calls = 0
	u = &outages{limit: time.Minute, say: func(string) {}, stopped: func() error { return errors.New("the cluster was stopped") }}
	if err := u.ask(ctx, func() error { calls++; return down[0] }); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "the cluster was stopped") || calls != 1 {
		t.Fatalf("an outage of a stopped cluster: %v after %d calls; want it at once, saying so", err, calls)
	}

	u = &outages{limit: 300 * time.Millisecond, say: func(string) {}}
	err = u.ask(ctx, func() error { return down[0] })
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "did not answer for") {
		t.Fatalf("an outage longer than the limit: %v", err)
	}
}
