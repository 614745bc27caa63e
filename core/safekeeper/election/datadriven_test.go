package election

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stratadb/strata/sdk/pg"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output in testdata/*.txt")

// TestDataDriven runs the scripts in testdata/*.txt. Each case is a command
// line, a line "----", the expected output, and a blank line; lines starting
// with # are comments. `go test -rewrite` regenerates the expected output.
//
// Command grammar (LSNs as X/Y, histories as TERM@LSN,TERM@LSN or "-"):
//
//	acceptor NAME [term=N] [compute=ID] [accepted] [history=H] [start=LSN] [flush=LSN]
//	    creates (or replaces) acceptor NAME with that persisted state.
//	vote NAME term=N compute=ID
//	    NAME handles a vote request; prints the response and its state.
//	accept NAME term=N compute=ID start=LSN donor=D history=H
//	    NAME plans an Accept; prints the plan or the error. The plan is kept.
//	apply NAME term=N
//	    carries out NAME's kept plan (truncate, fetch up to the plan's end)
//	    and calls Applied; prints the state.
//	append NAME flush=LSN
//	    NAME stored WAL from its compute up to flush.
//	may-follow NAME term=N compute=ID
//	    prints whether NAME stores and acknowledges WAL of that compute.
//	state NAME
//	    prints NAME's state.
//	divergence local=H local-end=LSN donor=H donor-end=LSN
//	    prints DivergencePoint.
//	propose term=N compute=ID members=A,B,C
//	    starts a proposer (members are acceptor names).
//	votes [from=A,B]
//	    delivers the proposer's vote request to those acceptors (default:
//	    all members) and their responses back; prints each response and
//	    the proposer's phase, donor and durable end.
//	trim start=LSN
//	    lowers the proposer's start (Proposer.Trim); prints the start in
//	    force and the proposer.
//	accepts
//	    delivers the proposer's pending Accepts; each acceptor plans, carries
//	    out and applies it (the fetch is simulated: the WAL then ends at the
//	    durable end) and the proposer records it; prints each outcome.
func TestDataDriven(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no testdata: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) { runFile(t, f) })
	}
}

type testCase struct {
	cmd, want string
	line      int
}

func parseFile(t *testing.T, path string) (cases []testCase, lines []string) {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines = strings.Split(string(b), "\n")
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if strings.TrimSpace(l) == "" || strings.HasPrefix(l, "#") {
			continue
		}
		c := testCase{cmd: l, line: i + 1}
		if i+1 >= len(lines) || lines[i+1] != "----" {
			t.Fatalf("%s:%d: want ---- after the command", path, i+1)
		}
		i += 2
		var out []string
		for ; i < len(lines) && lines[i] != ""; i++ {
			out = append(out, lines[i])
		}
		c.want = strings.Join(out, "\n")
		cases = append(cases, c)
	}
	return cases, lines
}

func runFile(t *testing.T, path string) {
	cases, lines := parseFile(t, path)
	e := &env{acc: map[string]*Acceptor{}, plans: map[string]Plan{}}
	var out strings.Builder
	next := 0 // next raw line to copy when rewriting
	for _, c := range cases {
		got := strings.TrimRight(e.run(t, c.cmd), "\n")
		if *rewrite {
			// Copy comments and blank lines before the case, then the case
			// with the new output.
			for ; next < c.line-1; next++ {
				out.WriteString(lines[next] + "\n")
			}
			fmt.Fprintf(&out, "%s\n----\n%s\n", c.cmd, got)
			next = c.line + 1
			for next < len(lines) && lines[next] != "" {
				next++
			}
			continue
		}
		if got != c.want {
			t.Errorf("%s:%d: %s\ngot:\n%s\nwant:\n%s", path, c.line, c.cmd, got, c.want)
		}
	}
	if *rewrite {
		for ; next < len(lines); next++ {
			out.WriteString(lines[next] + "\n")
		}
		if err := os.WriteFile(path, []byte(strings.TrimRight(out.String(), "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

type env struct {
	acc   map[string]*Acceptor
	plans map[string]Plan
	prop  *Proposer
}

func parseArgs(t *testing.T, fields []string) map[string]string {
	m := map[string]string{}
	for _, f := range fields {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			v = "true"
		}
		m[k] = v
	}
	return m
}

func lsnArg(t *testing.T, s string) pg.LSN {
	if s == "" {
		return 0
	}
	l, err := pg.ParseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func u64(t *testing.T, s string) uint64 {
	if s == "" {
		return 0
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func historyArg(t *testing.T, s string) History {
	if s == "" || s == "-" {
		return nil
	}
	var h History
	for _, part := range strings.Split(s, ",") {
		term, lsn, ok := strings.Cut(part, "@")
		if !ok {
			t.Fatalf("bad history entry %q", part)
		}
		h = append(h, TermStart{Term: u64(t, term), Start: lsnArg(t, lsn)})
	}
	return h
}

func fmtHistory(h History) string {
	if len(h) == 0 {
		return "-"
	}
	var p []string
	for _, e := range h {
		p = append(p, fmt.Sprintf("%d@%s", e.Term, e.Start))
	}
	return strings.Join(p, ",")
}

func fmtState(s AcceptorState) string {
	return fmt.Sprintf("term=%d compute=%s accepted=%t history=%s start=%s flush=%s",
		s.Term, orDash(s.ComputeID), s.Accepted, fmtHistory(s.History), s.Start, s.Flush)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func (e *env) get(t *testing.T, name string) *Acceptor {
	a, ok := e.acc[name]
	if !ok {
		t.Fatalf("no acceptor %q", name)
	}
	return a
}

func (e *env) run(t *testing.T, line string) string {
	fields := strings.Fields(line)
	cmd := fields[0]
	var name string
	if len(fields) > 1 && !strings.Contains(fields[1], "=") {
		name, fields = fields[1], fields[2:]
	} else {
		fields = fields[1:]
	}
	a := parseArgs(t, fields)
	switch cmd {
	case "acceptor":
		st := AcceptorState{Term: u64(t, a["term"]), ComputeID: a["compute"], Accepted: a["accepted"] == "true",
			History: historyArg(t, a["history"]), Start: lsnArg(t, a["start"]), Flush: lsnArg(t, a["flush"])}
		e.acc[name] = NewAcceptor(st)
		return fmtState(e.acc[name].State())
	case "vote":
		r := e.get(t, name).Vote(VoteRequest{Term: u64(t, a["term"]), ComputeID: a["compute"]})
		return fmtVote(r) + "\n" + fmtState(e.get(t, name).State())
	case "accept":
		p, err := e.get(t, name).Accept(AcceptRequest{Term: u64(t, a["term"]), ComputeID: a["compute"],
			Start: lsnArg(t, a["start"]), Donor: a["donor"], DonorHistory: historyArg(t, a["history"])})
		if err != nil {
			return "error: " + err.Error()
		}
		e.plans[name] = p
		return fmtPlan(p)
	case "apply":
		acc := e.get(t, name)
		p := e.plans[name]
		if err := acc.Applied(u64(t, a["term"]), p, p.FetchTo); err != nil {
			return "error: " + err.Error()
		}
		return fmtState(acc.State())
	case "append":
		acc := e.get(t, name)
		acc.Appended(lsnArg(t, a["flush"]))
		return fmtState(acc.State())
	case "may-follow":
		return strconv.FormatBool(e.get(t, name).MayFollow(u64(t, a["term"]), a["compute"]))
	case "state":
		return fmtState(e.get(t, name).State())
	case "divergence":
		return DivergencePoint(historyArg(t, a["local"]), lsnArg(t, a["local-end"]), historyArg(t, a["donor"]), lsnArg(t, a["donor-end"])).String()
	case "propose":
		e.prop = NewProposer(u64(t, a["term"]), a["compute"], strings.Split(a["members"], ","))
		return e.prop.State().String()
	case "votes":
		members := e.prop.members
		if a["from"] != "" {
			members = strings.Split(a["from"], ",")
		}
		var out []string
		for _, m := range members {
			r := e.get(t, m).Vote(e.prop.VoteRequest())
			e.prop.OnVote(m, r)
			out = append(out, m+": "+fmtVote(r))
		}
		return strings.Join(out, "\n") + "\n" + e.fmtProposer()
	case "trim":
		got := e.prop.Trim(lsnArg(t, a["start"]))
		return "start=" + got.String() + "\n" + e.fmtProposer()
	case "accepts":
		reqs := e.prop.AcceptRequests()
		names := make([]string, 0, len(reqs))
		for m := range reqs {
			names = append(names, m)
		}
		sort.Strings(names)
		var out []string
		for _, m := range names {
			acc := e.get(t, m)
			p, err := acc.Accept(reqs[m])
			if err != nil {
				out = append(out, m+": error: "+err.Error())
				e.prop.OnRejected(m, acc.State().Term)
				continue
			}
			if err := acc.Applied(reqs[m].Term, p, p.FetchTo); err != nil {
				out = append(out, m+": error: "+err.Error())
				continue
			}
			e.prop.OnAccepted(m)
			out = append(out, m+": "+fmtPlan(p))
		}
		return strings.Join(out, "\n") + "\n" + e.fmtProposer()
	}
	t.Fatalf("unknown command %q", cmd)
	return ""
}

func fmtVote(r VoteResponse) string {
	return fmt.Sprintf("granted=%t term=%d history=%s flush=%s", r.Granted, r.Term, fmtHistory(r.History), r.Flush)
}

func fmtPlan(p Plan) string {
	return fmt.Sprintf("truncate=%s fetch=%s..%s donor=%s history=%s", p.Truncate, p.FetchFrom, p.FetchTo, orDash(p.Donor), fmtHistory(p.History))
}

func (e *env) fmtProposer() string {
	d, s := e.prop.Donor()
	return fmt.Sprintf("proposer: %s donor=%s end=%s", e.prop.State(), orDash(d), s)
}
