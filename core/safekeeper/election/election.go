// Package election is the safekeepers' term and quorum logic as a pure state
// machine: no I/O, no clocks, no goroutines. Callers feed it messages and
// carry out the effects it returns (persist, truncate, fetch, follow), in the
// style of etcd's raft.
//
// Roles. The proposer is the strata compute agent: before it starts a
// Postgres it picks a term higher than any it has seen and asks every
// safekeeper to vote. An acceptor (a safekeeper) grants a vote only for a
// term higher than the one it has already voted for, and from then on
// refuses WAL and acknowledgements for older terms, which fences the old
// compute: it can no longer reach a quorum.
//
// With a quorum of votes the proposer picks the donor: the voter whose term
// history ends in the highest term, and among those the one with the highest
// flush LSN. Its flush LSN is the durable end E: every commit that an old
// compute saw acknowledged is on a quorum, every quorum of voters includes at
// least one of those safekeepers, and so E is at or above it. The proposer
// then sends Accept(term, E, donor history) to the voters. Each acceptor
// truncates its WAL where it diverges from the donor's history, fetches the
// missing range up to E from the donor, records (term, E) in its history and
// only then follows the new compute. The compute starts Postgres once a
// quorum has accepted, so E is then held by a quorum.
package election

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/stratadb/strata/sdk/pg"
)

// Sentinel errors.
var (
	// ErrStaleTerm: a request carries a term older than the acceptor's.
	ErrStaleTerm = errors.New("election: stale term")
	// ErrNotVoted: Accept for a term the acceptor did not vote in.
	ErrNotVoted = errors.New("election: accept without a vote in this term")
)

// TermStart says that term Term's WAL begins at Start.
type TermStart struct {
	Term  uint64
	Start pg.LSN
}

// History is a term history, ordered by term (and by start).
type History []TermStart

// LastTerm returns the term of the last entry, or 0.
func (h History) LastTerm() uint64 {
	if len(h) == 0 {
		return 0
	}
	return h[len(h)-1].Term
}

// String formats the history as "1@0/0 3@0/16B3A8".
func (h History) String() string {
	var parts []string
	for _, e := range h {
		parts = append(parts, fmt.Sprintf("%d@%s", e.Term, e.Start))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, " ")
}

// DivergencePoint returns the LSN up to which a log with history local and
// end localEnd agrees with a log with history donor and end donorEnd: the end
// of the last term both logs share, cut at both ends. A term has one
// proposer and so one start, and both logs hold the same WAL in it. Term 0 is
// the bootstrap term (streaming before any election), which an empty history
// stands for. With no common term it returns 0.
func DivergencePoint(local History, localEnd pg.LSN, donor History, donorEnd pg.LSN) pg.LSN {
	if len(local) == 0 {
		local = History{{}}
	}
	if len(donor) == 0 {
		donor = History{{}}
	}
	for i := len(local) - 1; i >= 0; i-- {
		for j := len(donor) - 1; j >= 0; j-- {
			if local[i].Term != donor[j].Term {
				continue
			}
			le, de := localEnd, donorEnd
			if i+1 < len(local) {
				le = local[i+1].Start
			}
			if j+1 < len(donor) {
				de = donor[j+1].Start
			}
			return min(le, de, localEnd, donorEnd)
		}
	}
	return 0
}

// VoteRequest asks an acceptor to vote for Term and its compute.
type VoteRequest struct {
	Term      uint64
	ComputeID string
}

// VoteResponse carries the acceptor's state, granted or not.
type VoteResponse struct {
	Granted bool
	Term    uint64 // the acceptor's term after handling the request
	History History
	Flush   pg.LSN
}

// AcceptRequest is the elected proposer's message: from term Term on,
// follow ComputeID, whose WAL begins at Start; DonorHistory (the donor's
// history, whose WAL ends at Start) and Donor say where to fetch missing WAL.
type AcceptRequest struct {
	Term         uint64
	ComputeID    string
	Start        pg.LSN
	Donor        string
	DonorHistory History
}

// AcceptorState is what an acceptor persists.
type AcceptorState struct {
	Term      uint64 // highest term voted in
	ComputeID string // the compute of Term
	Accepted  bool   // Term's Accept has been applied: the acceptor follows ComputeID
	History   History
	Start     pg.LSN // first LSN held
	Flush     pg.LSN // end of durable WAL
}

// Plan is what an acceptor must do, in order, to apply an Accept: truncate
// its WAL to Truncate (when Truncate < current flush), fetch [FetchFrom,
// FetchTo) from Donor (when FetchFrom < FetchTo), then persist the new state
// (Applied) and follow the compute.
type Plan struct {
	Truncate  pg.LSN
	FetchFrom pg.LSN
	FetchTo   pg.LSN
	Donor     string
	// History is the history to persist once the WAL matches the donor's.
	History History
}

// Acceptor is a safekeeper's side of the election.
type Acceptor struct {
	st AcceptorState
}

// NewAcceptor restores an acceptor from its persisted state.
func NewAcceptor(st AcceptorState) *Acceptor {
	st.History = append(History(nil), st.History...)
	return &Acceptor{st: st}
}

// State returns a copy of the state (to persist).
func (a *Acceptor) State() AcceptorState {
	s := a.st
	s.History = append(History(nil), a.st.History...)
	return s
}

// Vote handles a vote request. The caller must persist State() before it
// sends the response (a vote is a promise).
func (a *Acceptor) Vote(req VoteRequest) VoteResponse {
	if req.Term > a.st.Term {
		a.st.Term, a.st.ComputeID, a.st.Accepted = req.Term, req.ComputeID, false
		return VoteResponse{Granted: true, Term: a.st.Term, History: a.State().History, Flush: a.st.Flush}
	}
	return VoteResponse{Granted: false, Term: a.st.Term, History: a.State().History, Flush: a.st.Flush}
}

// Accept plans how to apply an AcceptRequest. It does not change the state;
// the caller executes the plan and then calls Applied.
func (a *Acceptor) Accept(req AcceptRequest) (Plan, error) {
	if req.Term < a.st.Term {
		return Plan{}, fmt.Errorf("%w: accept for term %d, acceptor is at %d", ErrStaleTerm, req.Term, a.st.Term)
	}
	if req.Term > a.st.Term || req.ComputeID != a.st.ComputeID {
		return Plan{}, fmt.Errorf("%w: term %d compute %q (acceptor: term %d compute %q)", ErrNotVoted, req.Term, req.ComputeID, a.st.Term, a.st.ComputeID)
	}
	div := max(DivergencePoint(a.st.History, a.st.Flush, req.DonorHistory, req.Start), a.st.Start)
	p := Plan{Truncate: min(div, a.st.Flush), Donor: req.Donor}
	p.FetchFrom, p.FetchTo = p.Truncate, req.Start
	if p.FetchFrom > p.FetchTo {
		p.FetchFrom = p.FetchTo
	}
	h := append(History(nil), req.DonorHistory...)
	if len(h) == 0 {
		h = History{{}}
	}
	if len(h) == 0 || h[len(h)-1].Term != req.Term {
		h = append(h, TermStart{Term: req.Term, Start: req.Start})
	}
	p.History = h
	return p, nil
}

// Applied records that plan p for term has been carried out: the WAL now
// ends at flush and matches the donor's. The caller persists State().
func (a *Acceptor) Applied(term uint64, p Plan, flush pg.LSN) error {
	if term != a.st.Term {
		return fmt.Errorf("%w: applied term %d, acceptor is at %d", ErrStaleTerm, term, a.st.Term)
	}
	a.st.History = append(History(nil), p.History...)
	a.st.Flush = flush
	a.st.Accepted = true
	return nil
}

// Appended records WAL appended by the followed compute.
func (a *Acceptor) Appended(flush pg.LSN) { a.st.Flush = max(a.st.Flush, flush) }

// Truncated records a truncation done outside an Accept (a tail that
// Postgres itself rewrote).
func (a *Acceptor) Truncated(flush pg.LSN) { a.st.Flush = flush }

// MayFollow reports whether WAL from the compute of term may be stored and
// acknowledged: only the compute of the current, accepted term.
func (a *Acceptor) MayFollow(term uint64, computeID string) bool {
	return a.st.Accepted && term == a.st.Term && computeID == a.st.ComputeID
}

// ProposerState is the phase of a proposer.
type ProposerState int

// The proposer's phases.
const (
	Voting    ProposerState = iota // collecting votes
	Accepting                      // the donor is chosen; collecting accepts
	Elected                        // a quorum accepted: the compute may start Postgres
	Fenced                         // a higher term exists: give up
)

func (s ProposerState) String() string {
	return [...]string{"voting", "accepting", "elected", "fenced"}[s]
}

// Proposer is the compute agent's side of the election for one term.
type Proposer struct {
	term      uint64
	computeID string
	members   []string
	quorum    int

	state    ProposerState
	votes    map[string]VoteResponse
	accepted map[string]bool
	donor    string
	start    pg.LSN
	history  History
	sent     map[string]bool
	highest  uint64 // highest term seen in a refusal
}

// NewProposer starts an election for term among members (safekeeper IDs);
// the quorum is a majority.
func NewProposer(term uint64, computeID string, members []string) *Proposer {
	m := append([]string(nil), members...)
	sort.Strings(m)
	return &Proposer{term: term, computeID: computeID, members: m, quorum: len(m)/2 + 1,
		votes: map[string]VoteResponse{}, accepted: map[string]bool{}, sent: map[string]bool{}}
}

// State returns the phase.
func (p *Proposer) State() ProposerState { return p.state }

// VoteRequest returns the request to send to every member.
func (p *Proposer) VoteRequest() VoteRequest {
	return VoteRequest{Term: p.term, ComputeID: p.computeID}
}

// OnVote handles a member's vote response.
func (p *Proposer) OnVote(from string, r VoteResponse) {
	if p.state == Fenced {
		return
	}
	if !r.Granted {
		if r.Term >= p.term {
			p.highest = max(p.highest, r.Term)
			p.state = Fenced
		}
		return
	}
	if r.Term != p.term {
		return
	}
	p.votes[from] = r
	if p.state == Voting && len(p.votes) >= p.quorum {
		p.chooseDonor()
		p.state = Accepting
	}
}

func (p *Proposer) chooseDonor() {
	var best string
	for _, m := range p.members {
		v, ok := p.votes[m]
		if !ok {
			continue
		}
		if best == "" {
			best = m
			continue
		}
		b := p.votes[best]
		if v.History.LastTerm() > b.History.LastTerm() ||
			v.History.LastTerm() == b.History.LastTerm() && v.Flush > b.Flush {
			best = m
		}
	}
	p.donor, p.start, p.history = best, p.votes[best].Flush, append(History(nil), p.votes[best].History...)
}

// Donor returns the chosen donor and the durable end E (valid once
// Accepting).
func (p *Proposer) Donor() (string, pg.LSN) { return p.donor, p.start }

// LastTermStart returns where the donor's last term begins (0 without a
// history; valid once Accepting).
func (p *Proposer) LastTermStart() pg.LSN {
	if len(p.history) == 0 {
		return 0
	}
	return p.history[len(p.history)-1].Start
}

// Trim lowers the new term's start below E, to start (clamped to the start
// of the donor's last term, a record end by construction). It is valid once
// Accepting and before the first AcceptRequests, and returns the start in
// force. The compute agent trims E to the end of the last complete WAL
// record: a donor's flush can cut a record that no Postgres will ever
// finish, the next Postgres writes on from the record end before it, and
// the tail past that end must not survive on any safekeeper of the new term
// (a safekeeper reporting it as flushed would acknowledge commits of the
// new Postgres that it does not hold). Every acknowledged commit ends at or
// below that record end, so trimming loses none.
func (p *Proposer) Trim(start pg.LSN) pg.LSN {
	if p.state != Accepting || len(p.sent) > 0 {
		return p.start
	}
	p.start = max(min(start, p.start), p.LastTermStart())
	return p.start
}

// HighestTerm returns the highest term seen in a refusal (when Fenced).
func (p *Proposer) HighestTerm() uint64 { return p.highest }

// AcceptRequests returns the Accept messages not yet sent, by member: one
// for every member that granted its vote.
func (p *Proposer) AcceptRequests() map[string]AcceptRequest {
	out := map[string]AcceptRequest{}
	if p.state != Accepting && p.state != Elected {
		return out
	}
	for m := range p.votes {
		if p.sent[m] {
			continue
		}
		p.sent[m] = true
		out[m] = AcceptRequest{Term: p.term, ComputeID: p.computeID, Start: p.start, Donor: p.donor,
			DonorHistory: append(History(nil), p.history...)}
	}
	return out
}

// OnAccepted records that a member applied the Accept (its WAL ends at E).
func (p *Proposer) OnAccepted(from string) {
	if p.state != Accepting && p.state != Elected {
		return
	}
	p.accepted[from] = true
	if len(p.accepted) >= p.quorum {
		p.state = Elected
	}
}

// OnRejected handles an Accept refused for a higher term.
func (p *Proposer) OnRejected(from string, term uint64) {
	if term > p.term {
		p.highest = max(p.highest, term)
		p.state = Fenced
	}
}
