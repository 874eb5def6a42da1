// etcdload: concurrent clients of etcd's Go client (clientv3) against TableKeeper's etcd port,
// recording every operation for the checker (tests/robustness/checker).
//
//	etcdload -endpoints A,B,C -out HISTORY.jsonl -clients 6 -keys 8 -duration 30s -seed 1
//
// Each client is one clientv3.Client (its own connections, balanced over the endpoints) running
// one operation at a time (every other client with a 1 s deadline, the others -op-timeout) on
// keys <prefix>0..<prefix>K-1: linearizable and serializable gets, puts, compare-and-set on the
// version (a Txn), deletes. Every value written is unique. A read
// that fails is recorded as "error" (it changed nothing), and so is a write whose connection
// could not be made or that TableKeeper refused before applying it (see failure); any other
// failed write is "unknown" (it may have been applied). After a failure a client waits
// 0.3-0.7 s. It stops issuing after -duration, waits for the calls in flight (each is
// bounded by -op-timeout) and exits 0 once the history is written.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

var (
	endpoints = flag.String("endpoints", "127.0.0.1:2379", "comma-separated etcd endpoints")
	out       = flag.String("out", "etcd-history.jsonl", "history file")
	clients   = flag.Int("clients", 6, "concurrent clients")
	keys      = flag.Int("keys", 8, "keys")
	prefix    = flag.String("prefix", "robust/", "key prefix")
	duration  = flag.Duration("duration", 30*time.Second, "how long to issue operations")
	opTimeout = flag.Duration("op-timeout", 5*time.Second, "deadline of one operation")
	rate      = flag.Float64("rate", 20, "operations per second per client (at most)")
	seed      = flag.Int64("seed", 1, "seed of the operation mix")
)

// monotonic: CLOCK_MONOTONIC in ns, the clock every workload stamps its history with.
func monotonic() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err)
	}
	return ts.Nano()
}

type record struct {
	Proto   string `json:"proto"`
	Session string `json:"session"`
	Key     string `json:"key"`
	Model   string `json:"model"`
	Op      string `json:"op"`
	Read    string `json:"read,omitempty"`
	Value   string `json:"value,omitempty"`
	Expect  int64  `json:"expect,omitempty"`
	Call    int64  `json:"call"`
	Ret     int64  `json:"ret"`
	Status  string `json:"status"`
	Found   bool   `json:"found,omitempty"`
	RValue  string `json:"rvalue,omitempty"`
	Version int64  `json:"version,omitempty"`
	Modrev  int64  `json:"modrev,omitempty"`
	Error   string `json:"error,omitempty"`
}

type history struct {
	mu sync.Mutex
	w  *bufio.Writer
}

func (h *history) add(r record) {
	line, err := json.Marshal(r)
	if err != nil {
		panic(err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.w.Write(line)
	h.w.WriteByte('\n')
}

// failure: the history status of a failed call. A read changed nothing. So did a write whose
// connection could not be made (the client retries a write only when it was never sent, so its
// last attempt failing to dial means none was), and one TableKeeper refused with UNAVAILABLE in
// etcd's words ("etcdserver: ..."), which it answers only before anything is applied, except
// "etcdserver: leader changed" (the owner was lost mid-call: it may have applied it). The
// checker holds the server to that: a write recorded as "error" must never show. Any other
// failed write is unknown.
func failure(op string, err error) (string, string) {
	text := err.Error()
	if op == "get" || strings.Contains(text, "connect: connection refused") {
		return "error", text
	}
	code := status.Code(err)
	var etcdErr rpctypes.EtcdError
	if errors.As(err, &etcdErr) {
		code = etcdErr.Code()
	}
	desc := rpctypes.ErrorDesc(err)
	if code == codes.Unavailable && strings.HasPrefix(desc, "etcdserver: ") &&
		desc != rpctypes.ErrLeaderChanged.Error() {
		return "error", text
	}
	return "unknown", text
}

func run(id int, h *history, stop time.Time, rng *rand.Rand) error {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   strings.Split(*endpoints, ","),
		DialTimeout: 10 * time.Second,
	})
	if err != nil {
		return err
	}
	defer cli.Close()
	session := fmt.Sprintf("etcd-%d", id)
	versions := map[string]int64{} // the last version this client saw of each key (0: absent)
	pause := time.Duration(float64(time.Second) / *rate)
	// Every other client gives up after 1 s: while an owner is paused it keeps calling (its
	// calls to the paused server may be answered when it resumes); the others wait -op-timeout.
	timeout := *opTimeout
	if id%2 == 1 && timeout > time.Second {
		timeout = time.Second
	}
	for seq := 0; time.Now().Before(stop); seq++ {
		key := fmt.Sprintf("%s%d", *prefix, rng.Intn(*keys))
		value := fmt.Sprintf("%s-%d", session, seq)
		r := record{Proto: "etcd", Session: session, Key: key, Model: "register"}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		dice := rng.Intn(100)
		r.Call = monotonic()
		switch {
		case dice < 35 || dice >= 95:
			r.Op = "get"
			var opts []clientv3.OpOption
			if dice >= 95 {
				r.Read = "serializable"
				opts = append(opts, clientv3.WithSerializable())
			}
			resp, err := cli.Get(ctx, key, opts...)
			r.Ret = monotonic()
			if err != nil {
				r.Status, r.Error = failure("get", err)
			} else {
				r.Status = "ok"
				versions[key] = 0
				if len(resp.Kvs) > 0 {
					kv := resp.Kvs[0]
					r.Found, r.RValue, r.Version, r.Modrev = true, string(kv.Value), kv.Version, kv.ModRevision
					versions[key] = kv.Version
				}
			}
		case dice < 65:
			r.Op, r.Value = "put", value
			resp, err := cli.Put(ctx, key, value)
			r.Ret = monotonic()
			if err != nil {
				r.Status, r.Error = failure("put", err)
			} else {
				r.Status, r.Modrev = "ok", resp.Header.Revision
			}
		case dice < 90:
			r.Op, r.Value = "cas", value
			expect := versions[key] // etcd: version 0 is "absent"
			r.Expect = expect
			if expect == 0 {
				r.Expect = -1
			}
			resp, err := cli.Txn(ctx).
				If(clientv3.Compare(clientv3.Version(key), "=", expect)).
				Then(clientv3.OpPut(key, value)).
				Commit()
			r.Ret = monotonic()
			switch {
			case err != nil:
				r.Status, r.Error = failure("cas", err)
			case resp.Succeeded:
				r.Status, r.Modrev = "ok", resp.Header.Revision
			default:
				r.Status = "fail"
			}
		default:
			r.Op = "del"
			resp, err := cli.Delete(ctx, key)
			r.Ret = monotonic()
			if err != nil {
				r.Status, r.Error = failure("del", err)
			} else {
				r.Status, r.Found = "ok", resp.Deleted > 0
			}
		}
		cancel()
		h.add(r)
		if r.Status == "error" || r.Status == "unknown" {
			// Back off after a failure, as an application would: an outage then costs a few
			// unknown writes, not hundreds (each of which the checker must place).
			time.Sleep(300*time.Millisecond + time.Duration(rng.Int63n(int64(400*time.Millisecond))))
		}
		time.Sleep(time.Duration(rng.Int63n(int64(2 * pause))))
	}
	return nil
}

func main() {
	flag.Parse()
	f, err := os.Create(*out)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	h := &history{w: bufio.NewWriterSize(f, 1<<16)}
	stop := time.Now().Add(*duration)
	errs := make(chan error, *clients)
	var wg sync.WaitGroup
	for i := 0; i < *clients; i++ {
		wg.Add(1)
		rng := rand.New(rand.NewSource(*seed*1000 + int64(i)))
		go func(i int) {
			defer wg.Done()
			if err := run(i, h, stop, rng); err != nil {
				errs <- fmt.Errorf("client %d: %v", i, err)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	failed := false
	for err := range errs {
		fmt.Fprintln(os.Stderr, err)
		failed = true
	}
	if err := h.w.Flush(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		failed = true
	}
	if err := f.Close(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		failed = true
	}
	if failed {
		os.Exit(1)
	}
	fmt.Println("DONE")
}
