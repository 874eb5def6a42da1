package main

import (
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/anishathalye/porcupine"
)

// The models are nondeterministic where the history leaves a choice (an unknown write whose
// condition cannot be decided from what was observed: it may or may not have applied); porcupine
// then tracks every possible state (NondeterministicModel.ToModel).

// regState is one key of a register: absent, or a value with its version and mod revision.
type regState struct {
	Exists  bool
	Value   string
	Version int64
	// The revision of the write that made this state; 0 when that write did not report it
	// (an unknown outcome, a protocol that does not answer it) and no read has seen it yet.
	Modrev int64
	// Every write from here on has a mod revision above Floor (revisions only grow).
	Floor int64
}

func (s regState) String() string {
	if !s.Exists {
		return fmt.Sprintf("absent (rev > %d)", s.Floor)
	}
	rev := "?"
	if s.Modrev != 0 {
		rev = fmt.Sprint(s.Modrev - revShift)
	}
	return fmt.Sprintf("%q v%d rev %s", s.Value, s.Version, rev)
}

func maxInt(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}

// written is the state after a write of value, reported at revision modrev (0: not reported).
func (s regState) written(g Guarantee, value string, modrev int64) regState {
	version := g.VersionBase
	if s.Exists {
		version = s.Version + 1
	}
	return regState{true, value, version, modrev, maxInt(s.Floor, s.Modrev)}
}

func (s regState) deleted() regState {
	return regState{Floor: maxInt(s.Floor, s.Modrev)}
}

// revisionFits: a write reporting modrev may follow s (revisions only grow).
func (s regState) revisionFits(modrev int64) bool {
	return modrev == 0 || modrev > maxInt(s.Floor, s.Modrev)
}

// readMatches: a read answering out could have read s; returns s with its revision learnt.
func (s regState) readMatches(out Output) (regState, bool) {
	if !out.Found {
		return s, !s.Exists
	}
	if !s.Exists || s.Value != out.Value || s.Version != out.Version {
		return s, false
	}
	if out.Modrev != 0 {
		if s.Modrev == 0 {
			if out.Modrev <= s.Floor {
				return s, false
			}
			s.Modrev = out.Modrev
		} else if s.Modrev != out.Modrev {
			return s, false
		}
	}
	return s, true
}

// condition: whether a cas expecting `expect` holds in s: 1 yes, 0 no, -1 cannot tell (it
// compares a revision this history never learnt).
func (s regState) condition(g Guarantee, expect int64) int {
	if expect == -1 {
		return boolInt(!s.Exists)
	}
	if !s.Exists {
		return 0
	}
	if g.CasOn == CasVersion {
		return boolInt(s.Version == expect)
	}
	if s.Modrev == 0 {
		if expect <= s.Floor {
			return 0
		}
		return -1
	}
	return boolInt(s.Modrev == expect)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// stepWrite: the states after a write (put, cas, del) whose answer is out.
func (s regState) stepWrite(g Guarantee, in Input, out Output) []regState {
	var after regState
	switch in.Op {
	case "del":
		after = s.deleted()
	default:
		if out.Status == "ok" && !s.revisionFits(out.Modrev) {
			return nil
		}
		modrev := int64(0)
		if out.Status == "ok" {
			modrev = out.Modrev
		}
		after = s.written(g, in.Value, modrev)
	}
	switch in.Op {
	case "put":
		return []regState{after}
	case "del":
		if out.Status == "ok" && out.Found != s.Exists { // it answers whether the key existed
			return nil
		}
		return []regState{after}
	}
	// cas
	holds := s.condition(g, in.Expect)
	switch out.Status {
	case "ok":
		if holds == 0 {
			return nil
		}
		if holds == -1 { // now we know the revision it compared
			after.Floor = maxInt(after.Floor, in.Expect)
		}
		return []regState{after}
	case "fail":
		if holds == 1 {
			return nil
		}
		return []regState{s}
	default: // unknown
		switch holds {
		case 1:
			return []regState{after}
		case 0:
			return []regState{s}
		}
		return []regState{s, after}
	}
}

func describeOp(in Input, out Output) string {
	var call string
	switch in.Op {
	case "get":
		call = "get"
		if in.Read != "" {
			call = "get(" + in.Read + ")"
		}
	case "put":
		call = fmt.Sprintf("put(%q)", in.Value)
	case "cas":
		expect := in.Expect
		if in.ExpectRev {
			expect -= revShift
		}
		call = fmt.Sprintf("cas(%d -> %q)", expect, in.Value)
	case "del":
		call = "del"
	case "incr":
		call = fmt.Sprintf("incr(%d)", in.Delta)
	}
	call = fmt.Sprintf("s%d %s", in.Session, call)
	switch out.Status {
	case "unknown":
		return call + " -> unknown: " + out.Error
	case "fail":
		return call + " -> condition failed"
	}
	switch in.Op {
	case "get":
		if out.HasTot {
			return fmt.Sprintf("%s -> %d", call, out.Total)
		}
		if !out.Found {
			return call + " -> absent"
		}
		if out.Modrev == 0 {
			return fmt.Sprintf("%s -> %q v%d", call, out.Value, out.Version)
		}
		return fmt.Sprintf("%s -> %q v%d rev %d", call, out.Value, out.Version, out.Modrev-revShift)
	case "incr":
		if out.HasTot {
			return fmt.Sprintf("%s -> %d", call, out.Total)
		}
		return call + " -> ok"
	case "del":
		return fmt.Sprintf("%s -> existed %v", call, out.Found)
	}
	if out.Modrev != 0 {
		return fmt.Sprintf("%s -> ok rev %d", call, out.Modrev-revShift)
	}
	return call + " -> ok"
}

func hashString(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

// registerModel: a linearizable register with versions and revisions, compare-and-set by
// version or by revision.
func registerModel(g Guarantee) porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Init: func() []interface{} { return []interface{}{regState{}} },
		Step: func(state, input, output interface{}) []interface{} {
			s, in, out := state.(regState), input.(Input), output.(Output)
			if in.Op == "get" {
				next, ok := s.readMatches(out)
				if !ok {
					return nil
				}
				return []interface{}{next}
			}
			var next []interface{}
			for _, n := range s.stepWrite(g, in, out) {
				next = append(next, n)
			}
			return next
		},
		Hash:              func(state interface{}) uint64 { return hashString(state.(regState).String()) },
		DescribeOperation: func(in, out interface{}) string { return describeOp(in.(Input), out.(Output)) },
		DescribeState:     func(state interface{}) string { return state.(regState).String() },
	}
	return nm.ToModel()
}

// sessionState: a register whose writes are linearizable and whose reads may be stale, but
// never older than what the reading session saw before. States lists every state the key has
// had (the last is current); Seen[i] is the index of the newest one session i saw, encoded as
// a string so that states compare with ==.
type sessionState struct {
	States string // regState values joined (see encode)
	N      int    // how many
	Seen   string // "session:index," sorted by session
}

func encodeStates(states []regState) string {
	parts := make([]string, len(states))
	for i, s := range states {
		parts[i] = fmt.Sprintf("%t\x1f%s\x1f%d\x1f%d\x1f%d", s.Exists, s.Value, s.Version, s.Modrev, s.Floor)
	}
	return strings.Join(parts, "\x1e")
}

func decodeStates(text string) []regState {
	if text == "" {
		return nil
	}
	var out []regState
	for _, part := range strings.Split(text, "\x1e") {
		f := strings.Split(part, "\x1f")
		var s regState
		s.Exists = f[0] == "true"
		s.Value = f[1]
		fmt.Sscan(f[2], &s.Version)
		fmt.Sscan(f[3], &s.Modrev)
		fmt.Sscan(f[4], &s.Floor)
		out = append(out, s)
	}
	return out
}

func decodeSeen(text string) map[int]int {
	seen := map[int]int{}
	for _, part := range strings.Split(text, ",") {
		if part == "" {
			continue
		}
		var session, index int
		fmt.Sscanf(part, "%d:%d", &session, &index)
		seen[session] = index
	}
	return seen
}

func encodeSeen(seen map[int]int) string {
	keys := make([]int, 0, len(seen))
	for k := range seen {
		keys = append(keys, k)
	}
	sortInts(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%d:%d,", k, seen[k])
	}
	return b.String()
}

func sortInts(a []int) {
	for i := 1; i < len(a); i++ {
		for j := i; j > 0 && a[j] < a[j-1]; j-- {
			a[j], a[j-1] = a[j-1], a[j]
		}
	}
}

// sessionModel: linearizable writes, reads sequential per session (ZooKeeper's promise).
// A read by session s returns some state at an index in [Seen[s], current]; the lowest such
// index that matches is taken (a lower Seen allows every later read a higher one does, so no
// valid history is refused for the choice). A write's own session sees it; an unknown write
// moves nobody's Seen.
func sessionModel(g Guarantee) porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Init: func() []interface{} {
			return []interface{}{sessionState{States: encodeStates([]regState{{}}), N: 1}}
		},
		Step: func(state, input, output interface{}) []interface{} {
			st, in, out := state.(sessionState), input.(Input), output.(Output)
			states := decodeStates(st.States)
			seen := decodeSeen(st.Seen)
			if in.Op == "get" {
				for i := seen[in.Session]; i < len(states); i++ {
					learnt, ok := states[i].readMatches(out)
					if !ok {
						continue
					}
					states[i] = learnt
					seen[in.Session] = i
					return []interface{}{sessionState{encodeStates(states), len(states), encodeSeen(seen)}}
				}
				return nil
			}
			current := states[len(states)-1]
			var next []interface{}
			for _, after := range current.stepWrite(g, in, out) {
				grown := append(append([]regState(nil), states...), after)
				s2 := map[int]int{}
				for k, v := range seen {
					s2[k] = v
				}
				if after == current { // a cas that did not apply: nothing new to see
					grown = states
				}
				if out.Status == "ok" || out.Status == "fail" {
					s2[in.Session] = len(grown) - 1
				}
				next = append(next, sessionState{encodeStates(grown), len(grown), encodeSeen(s2)})
			}
			return next
		},
		Hash: func(state interface{}) uint64 {
			st := state.(sessionState)
			return hashString(st.States + "\x1d" + st.Seen)
		},
		DescribeOperation: func(in, out interface{}) string { return describeOp(in.(Input), out.(Output)) },
		DescribeState: func(state interface{}) string {
			st := state.(sessionState)
			states := decodeStates(st.States)
			return fmt.Sprintf("%s (%d states; seen %s)", states[len(states)-1], st.N, st.Seen)
		},
	}
	return nm.ToModel()
}

// counterState: a number key (BookKeeper increments): absent counts as 0.
type counterState struct {
	Exists bool
	Total  int64
}

func counterModel() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Init: func() []interface{} { return []interface{}{counterState{}} },
		Step: func(state, input, output interface{}) []interface{} {
			s, in, out := state.(counterState), input.(Input), output.(Output)
			switch in.Op {
			case "get":
				if !out.Found {
					if s.Exists {
						return nil
					}
					return []interface{}{s}
				}
				if !s.Exists || s.Total != out.Total {
					return nil
				}
				return []interface{}{s}
			case "incr":
				next := counterState{true, s.Total + in.Delta}
				if out.Status == "ok" && out.HasTot && out.Total != next.Total {
					return nil
				}
				return []interface{}{next}
			}
			return nil
		},
		DescribeOperation: func(in, out interface{}) string { return describeOp(in.(Input), out.(Output)) },
		DescribeState: func(state interface{}) string {
			s := state.(counterState)
			if !s.Exists {
				return "absent (0)"
			}
			return fmt.Sprint(s.Total)
		},
	}
	return nm.ToModel()
}

// modelFor: the model a partition is checked against, from its protocol's guarantees.
func modelFor(p Partition) porcupine.Model {
	g := guarantees[p.Proto]
	if p.Model == "counter" {
		return counterModel()
	}
	if g.Reads == SequentialPerSession {
		return sessionModel(g)
	}
	return registerModel(g)
}
