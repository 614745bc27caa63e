package safekeeper

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/stratadb/strata/core/safekeeper/election"
	"github.com/stratadb/strata/core/safekeeper/server"
	"github.com/stratadb/strata/sdk/pg"
)

// ErrFenced: a higher term exists; this proposer must not start Postgres.
var ErrFenced = errors.New("safekeeper: fenced by a higher term")

// ErrNoQuorum: fewer than a quorum of safekeepers answered.
var ErrNoQuorum = errors.New("safekeeper: no quorum")

// Elect runs one election as the proposer (the compute agent's job before it
// starts Postgres): it asks every safekeeper in members (gRPC addresses) to
// vote for term, picks the donor and the durable end E, and has the voters
// truncate, catch up and accept. It returns E once a quorum has accepted;
// postgres is the host:port the safekeepers then stream from ("" keeps
// their configured one). It drives the pure election.Proposer.
func Elect(ctx context.Context, term uint64, computeID, postgres string, members []string) (pg.LSN, error) {
	e, err := ElectWith(ctx, term, computeID, postgres, members, ElectOptions{})
	return e.End, err
}

// Elected is the outcome of a won election.
type Elected struct {
	// End is E, the durable end of WAL, where the new term's WAL starts.
	End pg.LSN
	// Accept is the term's Accept message, the same for every member:
	// Join sends it to a member that missed the election.
	Accept election.AcceptRequest
}

// ElectOptions refine an election.
type ElectOptions struct {
	// Trim, when set, is called once the votes are in with the donor's
	// address, E and the start of the donor's last term, and returns where
	// the new term's WAL starts (at most E): the compute agent passes the
	// end of the last complete WAL record at or below E (see
	// election.Proposer.Trim). An error fails the election.
	Trim func(ctx context.Context, donor string, end, floor pg.LSN) (pg.LSN, error)
}

// ElectWith is Elect with options.
func ElectWith(ctx context.Context, term uint64, computeID, postgres string, members []string, o ElectOptions) (Elected, error) {
	clients := map[string]*server.Client{}
	for _, m := range members {
		c, err := server.Dial(m)
		if err != nil {
			return Elected{}, err
		}
		defer c.Close()
		clients[m] = c
	}
	p := election.NewProposer(term, computeID, members)
	type vote struct {
		from string
		r    election.VoteResponse
		err  error
	}
	votes := make(chan vote, len(members))
	for m, c := range clients {
		go func(m string, c *server.Client) {
			r, err := c.Vote(ctx, p.VoteRequest())
			votes <- vote{m, r, err}
		}(m, c)
	}
	var errs []error
	for range members {
		v := <-votes
		if v.err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", v.from, v.err))
			continue
		}
		p.OnVote(v.from, v.r)
	}
	switch p.State() {
	case election.Fenced:
		return Elected{}, fmt.Errorf("%w: term %d seen", ErrFenced, p.HighestTerm())
	case election.Voting:
		return Elected{}, fmt.Errorf("%w of votes for term %d: %w", ErrNoQuorum, term, errors.Join(errs...))
	}
	donor, end := p.Donor()
	if o.Trim != nil {
		start, err := o.Trim(ctx, donor, end, p.LastTermStart())
		if err != nil {
			return Elected{}, fmt.Errorf("safekeeper: election for term %d: the WAL tail of donor %s: %w", term, donor, err)
		}
		end = p.Trim(start)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	var accept election.AcceptRequest
	for m, req := range p.AcceptRequests() {
		accept = req
		wg.Add(1)
		go func(m string, req election.AcceptRequest) {
			defer wg.Done()
			_, err := clients[m].Accept(ctx, req, postgres)
			mu.Lock()
			defer mu.Unlock()
			if errors.Is(err, election.ErrStaleTerm) {
				p.OnRejected(m, term+1)
			} else if err != nil {
				errs = append(errs, fmt.Errorf("%s: accept: %w", m, err))
			} else {
				p.OnAccepted(m)
			}
		}(m, req)
	}
	wg.Wait()
	switch p.State() {
	case election.Elected:
		return Elected{End: end, Accept: accept}, nil
	case election.Fenced:
		return Elected{}, fmt.Errorf("%w during accept of term %d", ErrFenced, term)
	}
	return Elected{}, fmt.Errorf("%w of accepts for term %d: %w", ErrNoQuorum, term, errors.Join(errs...))
}

// Join brings member, a safekeeper that missed the election of req.Term
// (it was down or slow to answer), into the term: it votes for the term
// and applies req, the term's Accept (truncate what diverges, fetch the
// missing WAL from req.Donor, follow postgres). A member that already
// voted for the term only accepts. It fails with ErrFenced when the member
// has seen a higher term.
func Join(ctx context.Context, member string, req election.AcceptRequest, postgres string) error {
	c, err := server.Dial(member)
	if err != nil {
		return err
	}
	defer c.Close()
	r, err := c.Vote(ctx, election.VoteRequest{Term: req.Term, ComputeID: req.ComputeID})
	if err != nil {
		return fmt.Errorf("safekeeper: %s: vote for term %d: %w", member, req.Term, err)
	}
	if !r.Granted && r.Term > req.Term {
		return fmt.Errorf("%w: %s is at term %d, above %d", ErrFenced, member, r.Term, req.Term)
	}
	if _, err := c.Accept(ctx, req, postgres); err != nil {
		return fmt.Errorf("safekeeper: %s: accept term %d: %w", member, req.Term, err)
	}
	return nil
}
