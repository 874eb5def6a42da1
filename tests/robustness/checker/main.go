// checker reads the histories the robustness workloads wrote and checks each key's operations
// with porcupine against the model its protocol promises (guarantees.go).
//
//	checker -out DIR [-timeout 120s] [-nemesis NEMESIS.jsonl] HISTORY.jsonl...
//
// One line per protocol on stdout ("proto=etcd keys=24 ops=3120 unknown=41 result=ok"), then
// for every key whose history no order explains one "ILLEGAL ..." line naming the key and the
// HTML visualisation written into DIR (porcupine's: the longest orders it found, with the
// state after each operation, and the faults of -nemesis drawn under the operations). Exit status: 0 every key checked and explained, 1 some key is
// illegal, 2 some key could not be decided within the timeout (and none is illegal), 3 the
// input is unreadable.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

type verdict struct {
	part   Partition
	result porcupine.CheckResult
	info   porcupine.LinearizationInfo
}

func check(parts []Partition, timeout time.Duration) []verdict {
	verdicts := make([]verdict, len(parts))
	work := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < runtime.GOMAXPROCS(0); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				result, info := porcupine.CheckOperationsVerbose(modelFor(parts[i]), parts[i].Ops, timeout)
				verdicts[i] = verdict{parts[i], result, info}
			}
		}()
	}
	for i := range parts {
		work <- i
	}
	close(work)
	wg.Wait()
	return verdicts
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

// faults reads the nemesis log (start and end lines, CLOCK_MONOTONIC ns in "t") as
// visualisation annotations.
func faults(path string) []porcupine.Annotation {
	if path == "" {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "nemesis log:", err)
		return nil
	}
	defer f.Close()
	var out []porcupine.Annotation
	open := map[string]int64{}
	scanner := bufio.NewScanner(f)
	for scanner.Scan() {
		var e struct {
			Event, Kind, Target, Detail string
			T                           int64
		}
		if json.Unmarshal(scanner.Bytes(), &e) != nil {
			continue
		}
		key := e.Kind + "\x00" + e.Target
		switch e.Event {
		case "start":
			open[key] = e.T
		case "end":
			out = append(out, porcupine.Annotation{
				Tag: "nemesis", Start: open[key], End: e.T, Description: e.Kind,
				Details: e.Target + ": " + e.Detail, BackgroundColor: "#f6d3d3",
			})
			delete(open, key)
		}
	}
	return out
}

func main() {
	out := flag.String("out", ".", "directory for the visualisations of illegal keys")
	timeout := flag.Duration("timeout", 120*time.Second, "how long one key's check may take")
	nemesis := flag.String("nemesis", "", "the nemesis log, drawn into the visualisations")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: checker -out DIR [-timeout D] HISTORY.jsonl...")
		os.Exit(3)
	}
	for name, g := range guarantees {
		if g.SerializableReads != g.Reads {
			fmt.Fprintf(os.Stderr, "%s: serializable reads held apart from the others: not supported\n", name)
			os.Exit(3)
		}
	}
	records, err := readHistory(flag.Args())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	}
	parts := operations(records)
	verdicts := check(parts, *timeout)

	type summary struct{ keys, ops, unknown, illegal, undecided int }
	sums := map[string]*summary{}
	exit := 0
	var lines []string
	for _, v := range verdicts {
		s := sums[v.part.Proto]
		if s == nil {
			s = &summary{}
			sums[v.part.Proto] = s
		}
		s.keys++
		s.ops += len(v.part.Ops)
		s.unknown += v.part.Unknown
		switch v.result {
		case porcupine.Illegal:
			s.illegal++
			name := unsafeName.ReplaceAllString(v.part.Proto+"-"+v.part.Model+"-"+v.part.Key, "_")
			path, _ := filepath.Abs(filepath.Join(*out, name+".html"))
			if err := os.MkdirAll(*out, 0o755); err == nil {
				v.info.AddAnnotations(faults(*nemesis))
				err = porcupine.VisualizePath(modelFor(v.part), v.info, path)
				if err != nil {
					path = "(not written: " + err.Error() + ")"
				}
			}
			lines = append(lines, fmt.Sprintf(
				"ILLEGAL proto=%s model=%s key=%s ops=%d unknown=%d visualization=%s\n  %s",
				v.part.Proto, v.part.Model, v.part.Key, len(v.part.Ops), v.part.Unknown, path,
				guarantees[v.part.Proto].Describe))
			exit = 1
		case porcupine.Unknown:
			s.undecided++
			lines = append(lines, fmt.Sprintf("UNDECIDED proto=%s model=%s key=%s ops=%d unknown=%d (timeout %s)",
				v.part.Proto, v.part.Model, v.part.Key, len(v.part.Ops), v.part.Unknown, *timeout))
			if exit == 0 {
				exit = 2
			}
		}
	}
	protos := make([]string, 0, len(sums))
	for p := range sums {
		protos = append(protos, p)
	}
	sort.Strings(protos)
	for _, p := range protos {
		s := sums[p]
		result := "ok"
		if s.illegal > 0 {
			result = "illegal"
		} else if s.undecided > 0 {
			result = "undecided"
		}
		fmt.Printf("proto=%s keys=%d ops=%d unknown=%d illegal=%d undecided=%d result=%s\n",
			p, s.keys, s.ops, s.unknown, s.illegal, s.undecided, result)
	}
	for _, l := range lines {
		fmt.Println(l)
	}
	os.Exit(exit)
}
