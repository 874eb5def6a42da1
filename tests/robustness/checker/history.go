package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sort"

	"github.com/anishathalye/porcupine"
)

// Record is one line of a history file: one operation a client invoked, and what it saw. Every
// workload (the SDK's in Python, etcd's in Go, Oxia's in Java) writes this shape; the fields a
// kind of operation does not use are left out.
type Record struct {
	Proto   string `json:"proto"`   // sdk | etcd | oxia | zk: which guarantees apply (guarantees.go)
	Session string `json:"session"` // one sequential actor: a client's connection or session
	Key     string `json:"key"`
	Model   string `json:"model"`  // register | counter
	Op      string `json:"op"`     // get | put | cas | del | incr
	Read    string `json:"read"`   // a get's mode: "" (the protocol's default) or "serializable"
	Value   string `json:"value"`  // put, cas: what is written (unique in the history)
	Expect  int64  `json:"expect"` // cas: the version (or version id) required; -1: must not exist
	// Expect is a revision, shifted by revShift (a protocol whose cas compares revisions).
	ExpectRev bool  `json:"-"`
	Delta     int64 `json:"delta"` // incr
	Call      int64 `json:"call"`  // CLOCK_MONOTONIC ns when invoked
	Ret       int64 `json:"ret"`   // CLOCK_MONOTONIC ns when it returned (any status)
	// ok: done, with a result; fail: a cas whose condition did not hold (nothing written);
	// unknown: a write that may or may not have taken effect (timeout, cut connection, an
	// "outcome unknown" answer); error: nothing happened (a read that failed, a write refused
	// before it was applied).
	Status  string `json:"status"`
	Found   bool   `json:"found"`   // get: the key exists
	RValue  string `json:"rvalue"`  // get: its value
	Version int64  `json:"version"` // get: its version; put/cas: the new version, when reported
	// get: its mod revision; put/cas: the write's, when reported. Absent: not reported; 0 is a
	// revision like any other (Oxia's first version id).
	ModrevJSON *int64 `json:"modrev"`
	// The revision as the models hold it: one above what the client saw, so that 0 can mean
	// "not reported" (see revShift).
	Modrev int64  `json:"-"`
	Total  int64  `json:"total"` // incr with a total, get of a counter
	HasTot bool   `json:"has_total"`
	Error  string `json:"error"` // for the report
	File   string `json:"-"`
	Line   int    `json:"-"`
}

// Input and Output are what porcupine sees of an operation.
type Input struct {
	Op        string
	Key       string
	Read      string
	Value     string
	Expect    int64
	ExpectRev bool // Expect is a revision (shifted by revShift)
	Delta     int64
	Session   int // index of the record's session within its protocol
}

type Output struct {
	Status  string
	Found   bool
	Value   string
	Version int64
	Modrev  int64
	Total   int64
	HasTot  bool
	Error   string
}

func readHistory(paths []string) ([]Record, error) {
	var records []Record
	for _, path := range paths {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		scanner := bufio.NewScanner(f)
		scanner.Buffer(make([]byte, 1<<20), 1<<24)
		line := 0
		for scanner.Scan() {
			line++
			text := scanner.Bytes()
			if len(text) == 0 {
				continue
			}
			var r Record
			if err := json.Unmarshal(text, &r); err != nil {
				f.Close()
				return nil, fmt.Errorf("%s:%d: %v", path, line, err)
			}
			r.File, r.Line = path, line
			r.shiftRevisions()
			if err := r.validate(); err != nil {
				f.Close()
				return nil, fmt.Errorf("%s:%d: %v", path, line, err)
			}
			records = append(records, r)
		}
		err = scanner.Err()
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %v", path, err)
		}
	}
	return records, nil
}

// revShift is what the models add to every revision a history reports, and to a cas's expected
// revision where the protocol compares revisions: revisions start at 0 on some protocols (an
// Oxia shard's first write has version id 0), and the models keep 0 for "not reported".
const revShift = 1

func (r *Record) shiftRevisions() {
	if r.ModrevJSON != nil {
		r.Modrev = *r.ModrevJSON + revShift
	}
	if g, ok := guarantees[r.Proto]; ok && r.Op == "cas" && g.CasOn == CasModrev && r.Expect >= 0 {
		r.Expect += revShift
		r.ExpectRev = true
	}
}

func (r Record) validate() error {
	if _, ok := guarantees[r.Proto]; !ok {
		return fmt.Errorf("unknown proto %q", r.Proto)
	}
	if r.Key == "" || r.Session == "" {
		return fmt.Errorf("record without key or session")
	}
	switch r.Model {
	case "register":
		switch r.Op {
		case "get", "put", "cas", "del":
		default:
			return fmt.Errorf("op %q is not a register op", r.Op)
		}
	case "counter":
		switch r.Op {
		case "get", "incr":
		default:
			return fmt.Errorf("op %q is not a counter op", r.Op)
		}
	default:
		return fmt.Errorf("unknown model %q", r.Model)
	}
	switch r.Status {
	case "ok", "fail", "unknown", "error":
	default:
		return fmt.Errorf("unknown status %q", r.Status)
	}
	if r.Status == "fail" && r.Op != "cas" && r.Op != "del" {
		return fmt.Errorf("status fail is only for a conditional write, not %q", r.Op)
	}
	if r.Ret < r.Call {
		return fmt.Errorf("returned (%d) before it was called (%d)", r.Ret, r.Call)
	}
	return nil
}

// Partition is the operations of one (protocol, model, key): checked on their own.
type Partition struct {
	Proto, Model, Key string
	Ops               []porcupine.Operation
	Unknown           int
	clients           map[string]int
}

// operations turns records into porcupine operations, per protocol, model and key:
//   - an "error" (nothing happened) is left out;
//   - an "unknown" write may take effect at any time after its call: it returns at the end of
//     the history (so it may also be ordered after everything, i.e. never take effect), unless
//     a read returned the value it wrote: then it took effect before that read returned;
//   - each session's operations get a client id; a session that left an unknown operation
//     behind goes on under a new id (its next call overlaps that one's open end).
func operations(records []Record) []Partition {
	end := int64(0)
	for _, r := range records {
		if r.Ret > end {
			end = r.Ret
		}
	}
	end++
	seenBy := map[string]int64{} // proto/key/value -> earliest return of a read that saw it
	for _, r := range records {
		if r.Status == "ok" && r.Op == "get" && r.Found && r.Model == "register" {
			k := r.Proto + "\x00" + r.Key + "\x00" + r.RValue
			if t, ok := seenBy[k]; !ok || r.Ret < t {
				seenBy[k] = r.Ret
			}
		}
	}
	sessions := map[string]map[string]int{} // proto -> session -> index
	incarnation := map[string]int{}         // proto/session -> how many unknown operations it left open
	parts := map[string]*Partition{}
	var order []string
	sorted := append([]Record(nil), records...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Call < sorted[j].Call })
	for _, r := range sorted {
		if r.Status == "error" {
			continue
		}
		if sessions[r.Proto] == nil {
			sessions[r.Proto] = map[string]int{}
		}
		sIndex, ok := sessions[r.Proto][r.Session]
		if !ok {
			sIndex = len(sessions[r.Proto])
			sessions[r.Proto][r.Session] = sIndex
		}
		sKey := r.Proto + "\x00" + r.Session
		idKey := fmt.Sprintf("%s\x00%d", sKey, incarnation[sKey])
		ret := r.Ret
		if r.Status == "unknown" {
			ret = end
			if r.Op == "put" || r.Op == "cas" {
				if t, ok := seenBy[r.Proto+"\x00"+r.Key+"\x00"+r.Value]; ok && t >= r.Call {
					ret = t
				}
			}
			incarnation[sKey]++
		}
		pKey := r.Proto + "\x00" + r.Model + "\x00" + r.Key
		p, ok := parts[pKey]
		if !ok {
			p = &Partition{Proto: r.Proto, Model: r.Model, Key: r.Key, clients: map[string]int{}}
			parts[pKey] = p
			order = append(order, pKey)
		}
		id, ok := p.clients[idKey]
		if !ok { // client ids are dense within a partition: one row each in the visualisation
			id = len(p.clients)
			p.clients[idKey] = id
		}
		if r.Status == "unknown" {
			p.Unknown++
		}
		p.Ops = append(p.Ops, porcupine.Operation{
			ClientId: id,
			Input: Input{
				Op: r.Op, Key: r.Key, Read: r.Read, Value: r.Value, Expect: r.Expect, ExpectRev: r.ExpectRev,
				Delta: r.Delta, Session: sIndex,
			},
			Call: r.Call,
			Output: Output{
				Status: r.Status, Found: r.Found, Value: r.RValue, Version: r.Version,
				Modrev: r.Modrev, Total: r.Total, HasTot: r.HasTot, Error: r.Error,
			},
			Return:   ret,
			Metadata: fmt.Sprintf("%s:%d session %s", r.File, r.Line, r.Session),
		})
	}
	sort.Strings(order)
	out := make([]Partition, 0, len(order))
	for _, k := range order {
		out = append(out, *parts[k])
	}
	return out
}
