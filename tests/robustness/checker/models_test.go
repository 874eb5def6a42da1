package main

import (
	"os"
	"testing"

	"github.com/anishathalye/porcupine"
)

// rec builds a record; the tests write histories as a person would read them.
func rec(proto, session, op string, call, ret int64, status string) Record {
	return Record{Proto: proto, Session: session, Key: "k", Model: "register", Op: op,
		Call: call, Ret: ret, Status: status}
}

func put(proto, session, value string, call, ret int64, status string) Record {
	r := rec(proto, session, "put", call, ret, status)
	r.Value = value
	return r
}

func cas(proto, session string, expect int64, value string, call, ret int64, status string) Record {
	r := rec(proto, session, "cas", call, ret, status)
	r.Value, r.Expect = value, expect
	return r
}

func get(proto, session string, call, ret int64, value string, version, modrev int64) Record {
	r := rec(proto, session, "get", call, ret, "ok")
	if value != "" {
		r.Found, r.RValue, r.Version, r.Modrev = true, value, version, modrev
	}
	return r
}

func verdictOf(t *testing.T, records []Record) porcupine.CheckResult {
	t.Helper()
	for _, r := range records {
		if err := r.validate(); err != nil {
			t.Fatalf("bad record %+v: %v", r, err)
		}
	}
	parts := operations(records)
	result := porcupine.Ok
	for _, v := range check(parts, 0) {
		if v.result != porcupine.Ok {
			result = v.result
		}
	}
	return result
}

func TestLinearizableRegister(t *testing.T) {
	ok := []Record{
		put("sdk", "a", "x", 0, 10, "ok"),
		get("sdk", "b", 5, 8, "x", 0, 0), // concurrent with the put: may see it
		put("sdk", "a", "y", 20, 30, "ok"),
		get("sdk", "b", 31, 40, "y", 1, 7),
		cas("sdk", "b", 1, "z", 41, 50, "ok"),
		cas("sdk", "a", 1, "w", 51, 60, "fail"),
		get("sdk", "a", 61, 70, "z", 2, 9),
	}
	if got := verdictOf(t, ok); got != porcupine.Ok {
		t.Fatalf("a linearizable history judged %v", got)
	}
	stale := []Record{
		put("sdk", "a", "x", 0, 10, "ok"),
		put("sdk", "a", "y", 20, 30, "ok"),
		get("sdk", "b", 31, 40, "x", 0, 0), // the put of y completed before this read began
	}
	if got := verdictOf(t, stale); got != porcupine.Illegal {
		t.Fatalf("a stale read judged %v", got)
	}
	lost := []Record{
		put("etcd", "a", "x", 0, 10, "ok"),
		get("etcd", "b", 20, 30, "", 0, 0), // an acknowledged write gone
	}
	if got := verdictOf(t, lost); got != porcupine.Illegal {
		t.Fatalf("a lost write judged %v", got)
	}
	badVersion := []Record{
		put("etcd", "a", "x", 0, 10, "ok"),
		get("etcd", "b", 20, 30, "x", 0, 0), // etcd counts versions from 1
	}
	if got := verdictOf(t, badVersion); got != porcupine.Illegal {
		t.Fatalf("a wrong version judged %v", got)
	}
	revisionBack := []Record{
		get("etcd", "b", 0, 1, "", 0, 0),
		put("etcd", "a", "x", 2, 10, "ok"),
		get("etcd", "b", 11, 12, "x", 1, 50),
		put("etcd", "a", "y", 20, 30, "ok"),
		get("etcd", "b", 31, 40, "y", 2, 40), // a later write at a lower revision
	}
	if got := verdictOf(t, revisionBack); got != porcupine.Illegal {
		t.Fatalf("a revision going back judged %v", got)
	}
}

func TestUnknownWrites(t *testing.T) {
	// An unknown put may take effect late, or never.
	late := []Record{
		put("sdk", "a", "x", 0, 10, "ok"),
		put("sdk", "a", "y", 20, 30, "unknown"),
		get("sdk", "b", 40, 50, "x", 0, 0),
		get("sdk", "b", 60, 70, "y", 1, 0),
	}
	if got := verdictOf(t, late); got != porcupine.Ok {
		t.Fatalf("an unknown put applied late judged %v", got)
	}
	never := []Record{
		put("sdk", "a", "x", 0, 10, "ok"),
		put("sdk", "a", "y", 20, 30, "unknown"),
		get("sdk", "b", 40, 50, "x", 0, 0),
	}
	if got := verdictOf(t, never); got != porcupine.Ok {
		t.Fatalf("an unknown put never applied judged %v", got)
	}
	// Once seen, it cannot be unseen.
	flicker := []Record{
		put("sdk", "a", "x", 0, 10, "ok"),
		put("sdk", "a", "y", 20, 30, "unknown"),
		get("sdk", "b", 40, 50, "y", 1, 0),
		get("sdk", "b", 60, 70, "x", 0, 0),
	}
	if got := verdictOf(t, flicker); got != porcupine.Illegal {
		t.Fatalf("a value coming back judged %v", got)
	}
	// An unknown cas on Oxia, whose condition compares a revision never learnt: both ways.
	oxiaBoth := []Record{
		put("oxia", "a", "x", 0, 10, "unknown"),
		cas("oxia", "a", 99, "y", 20, 30, "unknown"),
		get("oxia", "b", 40, 50, "y", 1, 120),
		get("oxia", "b", 60, 70, "y", 1, 120),
	}
	if got := verdictOf(t, oxiaBoth); got != porcupine.Ok {
		t.Fatalf("an undecidable unknown cas judged %v", got)
	}
	// A failed (definite) cas writes nothing.
	failed := []Record{
		put("sdk", "a", "x", 0, 10, "ok"),
		cas("sdk", "a", 5, "y", 20, 30, "fail"),
		get("sdk", "b", 40, 50, "y", 1, 0),
	}
	if got := verdictOf(t, failed); got != porcupine.Illegal {
		t.Fatalf("a failed cas that wrote judged %v", got)
	}
}

func TestCounter(t *testing.T) {
	incr := func(session string, delta int64, call, ret int64, status string, total int64) Record {
		r := Record{Proto: "sdk", Session: session, Key: "c", Model: "counter", Op: "incr",
			Delta: delta, Call: call, Ret: ret, Status: status}
		if status == "ok" {
			r.Total, r.HasTot = total, true
		}
		return r
	}
	read := func(call, ret int64, total int64) Record {
		return Record{Proto: "sdk", Session: "r", Key: "c", Model: "counter", Op: "get",
			Call: call, Ret: ret, Status: "ok", Found: true, Total: total, HasTot: true}
	}
	ok := []Record{
		incr("a", 1, 0, 10, "ok", 1),
		incr("b", 2, 5, 15, "unknown", 0),
		incr("a", 4, 20, 30, "ok", 7),
		read(40, 50, 7),
	}
	if got := verdictOf(t, ok); got != porcupine.Ok {
		t.Fatalf("counter history judged %v", got)
	}
	doubled := []Record{
		incr("a", 1, 0, 10, "ok", 1),
		read(20, 30, 2), // applied twice
	}
	if got := verdictOf(t, doubled); got != porcupine.Illegal {
		t.Fatalf("a doubled increment judged %v", got)
	}
}

func TestSequentialPerSession(t *testing.T) {
	// A session may read a state older than another session's completed write...
	stale := []Record{
		put("zk", "a", "x", 0, 10, "ok"),
		put("zk", "a", "y", 20, 30, "ok"),
		get("zk", "b", 31, 40, "x", 0, 0),
		get("zk", "b", 41, 50, "y", 1, 0),
	}
	if got := verdictOf(t, stale); got != porcupine.Ok {
		t.Fatalf("a stale read in ZooKeeper judged %v", got)
	}
	// ...but never go back in time,
	back := []Record{
		put("zk", "a", "x", 0, 10, "ok"),
		put("zk", "a", "y", 20, 30, "ok"),
		get("zk", "b", 31, 40, "y", 1, 0),
		get("zk", "b", 41, 50, "x", 0, 0),
	}
	if got := verdictOf(t, back); got != porcupine.Illegal {
		t.Fatalf("a session going back judged %v", got)
	}
	// ...nor miss its own write,
	own := []Record{
		put("zk", "a", "x", 0, 10, "ok"),
		put("zk", "b", "y", 20, 30, "ok"),
		get("zk", "b", 31, 40, "x", 0, 0),
	}
	if got := verdictOf(t, own); got != porcupine.Illegal {
		t.Fatalf("a session missing its own write judged %v", got)
	}
	// ...nor read a value never written, and writes stay linearizable.
	lost := []Record{
		put("zk", "a", "x", 0, 10, "ok"),
		cas("zk", "b", 5, "z", 20, 30, "ok"),
	}
	if got := verdictOf(t, lost); got != porcupine.Illegal {
		t.Fatalf("a cas on a version never reached judged %v", got)
	}
}

// fromJSON reads records as a history file holds them (revisions as the client saw them).
func fromJSON(t *testing.T, lines ...string) []Record {
	t.Helper()
	path := t.TempDir() + "/history.jsonl"
	text := ""
	for _, l := range lines {
		text += l + "\n"
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	records, err := readHistory([]string{path})
	if err != nil {
		t.Fatal(err)
	}
	return records
}

// An Oxia shard's first write has version id 0: a cas expecting 0 after it must hold, and a
// cas expecting 0 after a later write must not.
func TestRevisionZeroIsARevision(t *testing.T) {
	const k = `"proto":"oxia","model":"register","key":"k"`
	ok := fromJSON(t,
		`{`+k+`,"session":"a","op":"cas","expect":-1,"value":"x","call":0,"ret":10,"status":"ok","modrev":0}`,
		`{`+k+`,"session":"b","op":"get","call":11,"ret":20,"status":"ok","found":true,"rvalue":"x","version":0,"modrev":0}`,
		`{`+k+`,"session":"b","op":"cas","expect":0,"value":"y","call":21,"ret":30,"status":"ok","modrev":3}`,
	)
	if got := verdictOf(t, ok); got != porcupine.Ok {
		t.Fatalf("a cas on version id 0 after the first write: %v, want ok", got)
	}
	bad := fromJSON(t,
		`{`+k+`,"session":"a","op":"cas","expect":-1,"value":"x","call":0,"ret":10,"status":"ok","modrev":0}`,
		`{`+k+`,"session":"a","op":"put","value":"y","call":11,"ret":20,"status":"ok","modrev":1}`,
		`{`+k+`,"session":"b","op":"cas","expect":0,"value":"z","call":21,"ret":30,"status":"ok","modrev":3}`,
	)
	if got := verdictOf(t, bad); got != porcupine.Illegal {
		t.Fatalf("a cas on version id 0 after it was overwritten: %v, want illegal", got)
	}
}
