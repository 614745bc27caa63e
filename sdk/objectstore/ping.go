package objectstore

import (
	"context"
	"errors"
	"fmt"
)

// PingKey is the key Ping asks about; it need not exist.
const PingKey = ".strata-ping"

// Ping asks s one cheap question (a Stat of PingKey) and returns nil when
// s answers within ctx, a missing key being an answer. Callers use it
// before work that would otherwise wait out a long bound on a store that
// does not answer, such as a last upload at shutdown.
func Ping(ctx context.Context, s Store) error {
	_, err := s.Stat(ctx, PingKey)
	if err == nil || errors.Is(err, ErrNotFound) {
		return nil
	}
	return fmt.Errorf("objectstore: no answer to a ping: %w", err)
}
