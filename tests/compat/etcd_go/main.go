// etcdgo drives etcd's Go client (go.etcd.io/etcd/client/v3 and its concurrency package)
// against an etcd endpoint, for tests/compat/test_etcd_clientv3.py. Each subcommand prints
// what it observed, one fact per line, and exits non-zero when an invariant broke.
//
//	etcdgo mutex  -endpoint E -name N -rounds R [-hold]   lock, check exclusion, count, unlock
//	etcdgo elect  -endpoint E -name N [-hold]             campaign; print LEADER; resign
//	etcdgo bank   -endpoint E -accounts A -workers W -transfers T
//	etcdgo load   -endpoint E -prefix P -workers W -count C   acknowledged puts + a watch
//	etcdgo auth   -endpoint E -user U -password P [-cacert CA] -prefix P
//	                                                       log in; put, get, lease, watch
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"strconv"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

var (
	endpoint  = flag.String("endpoint", "127.0.0.1:2379", "etcd endpoint")
	name      = flag.String("name", "c", "contender name")
	rounds    = flag.Int("rounds", 5, "mutex rounds")
	hold      = flag.Bool("hold", false, "after the first lock/election, hold it until killed")
	ttl       = flag.Int("ttl", 30, "session TTL in seconds (long: a busy machine's pauses must not end a live session)")
	accounts  = flag.Int("accounts", 10, "bank accounts")
	workers   = flag.Int("workers", 8, "concurrent workers")
	transfers = flag.Int("transfers", 100, "transfers per worker")
	prefix    = flag.String("prefix", "load/", "key prefix of the load")
	count     = flag.Int("count", 1000, "puts per load worker")
	user      = flag.String("user", "", "user name (logs in with Authenticate)")
	password  = flag.String("password", "", "password of -user")
	cacert    = flag.String("cacert", "", "PEM CA of the server's certificate: talk TLS")
)

func fail(format string, args ...any) {
	fmt.Printf("FAIL "+format+"\n", args...)
	os.Exit(1)
}

func client() *clientv3.Client {
	config := clientv3.Config{
		Endpoints:   []string{*endpoint},
		DialTimeout: 10 * time.Second,
		Username:    *user,
		Password:    *password,
	}
	if *cacert != "" {
		pem, err := os.ReadFile(*cacert)
		if err != nil {
			fail("read %s: %v", *cacert, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			fail("no certificate in %s", *cacert)
		}
		config.TLS = &tls.Config{RootCAs: pool}
	}
	cli, err := clientv3.New(config)
	if err != nil {
		fail("connect: %v", err)
	}
	return cli
}

func main() {
	if len(os.Args) < 2 {
		fail("usage: etcdgo mutex|elect|bank|load [flags]")
	}
	command := os.Args[1]
	if err := flag.CommandLine.Parse(os.Args[2:]); err != nil {
		fail("flags: %v", err)
	}
	switch command {
	case "mutex":
		mutex()
	case "elect":
		elect()
	case "bank":
		bank()
	case "load":
		load()
	case "auth":
		auth()
	default:
		fail("unknown command %q", command)
	}
}

// mutex: inside the lock, the holder key must be free (the previous holder deleted it, or its
// lease expired with it); the counter is read and written back plus one, which loses updates
// unless the lock really excludes.
func mutex() {
	cli := client()
	defer cli.Close()
	ctx := context.Background()
	session, err := concurrency.NewSession(cli, concurrency.WithTTL(*ttl))
	if err != nil {
		fail("session: %v", err)
	}
	lock := concurrency.NewMutex(session, "/mutex/lock")
	for i := 0; i < *rounds; i++ {
		if err := lock.Lock(ctx); err != nil {
			fail("lock: %v", err)
		}
		holder, err := cli.Get(ctx, "/mutex/holder")
		if err != nil {
			fail("get holder: %v", err)
		}
		if len(holder.Kvs) > 0 {
			fail("%s got the lock while %s holds it", *name, holder.Kvs[0].Value)
		}
		if _, err := cli.Put(ctx, "/mutex/holder", *name, clientv3.WithLease(session.Lease())); err != nil {
			fail("put holder: %v", err)
		}
		fmt.Printf("LOCKED %s %d\n", *name, i)
		if *hold {
			select {} // until killed: the lease expires, and the lock and holder key with it
		}
		got, err := cli.Get(ctx, "/mutex/count")
		if err != nil {
			fail("get count: %v", err)
		}
		n := 0
		if len(got.Kvs) > 0 {
			n, _ = strconv.Atoi(string(got.Kvs[0].Value))
		}
		if _, err := cli.Put(ctx, "/mutex/count", strconv.Itoa(n+1)); err != nil {
			fail("put count: %v", err)
		}
		if _, err := cli.Delete(ctx, "/mutex/holder"); err != nil {
			fail("delete holder: %v", err)
		}
		if err := lock.Unlock(ctx); err != nil {
			fail("unlock: %v", err)
		}
	}
	session.Close()
	fmt.Printf("DONE %s\n", *name)
}

// elect: campaign; once leader, the election's leader must be us; print it, then resign (or
// hold until killed).
func elect() {
	cli := client()
	defer cli.Close()
	ctx := context.Background()
	session, err := concurrency.NewSession(cli, concurrency.WithTTL(*ttl))
	if err != nil {
		fail("session: %v", err)
	}
	election := concurrency.NewElection(session, "/election")
	if err := election.Campaign(ctx, *name); err != nil {
		fail("campaign: %v", err)
	}
	leader, err := election.Leader(ctx)
	if err != nil {
		fail("leader: %v", err)
	}
	if string(leader.Kvs[0].Value) != *name {
		fail("%s won, but the leader is %s", *name, leader.Kvs[0].Value)
	}
	fmt.Printf("LEADER %s %d\n", *name, leader.Kvs[0].CreateRevision)
	if *hold {
		select {}
	}
	if err := election.Resign(ctx); err != nil {
		fail("resign: %v", err)
	}
	session.Close()
	fmt.Printf("RESIGNED %s\n", *name)
}

// bank: concurrent STM transfers between accounts; the total never changes.
func bank() {
	cli := client()
	defer cli.Close()
	ctx := context.Background()
	key := func(i int) string { return fmt.Sprintf("/bank/%03d", i) }
	for i := 0; i < *accounts; i++ {
		if _, err := cli.Put(ctx, key(i), "100"); err != nil {
			fail("init: %v", err)
		}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []error
	for w := 0; w < *workers; w++ {
		wg.Add(1)
		go func(seed int64) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(seed))
			for t := 0; t < *transfers; t++ {
				from, to := rng.Intn(*accounts), rng.Intn(*accounts)
				if from == to {
					continue
				}
				amount := rng.Intn(20) + 1
				_, err := concurrency.NewSTM(cli, func(stm concurrency.STM) error {
					a, _ := strconv.Atoi(stm.Get(key(from)))
					b, _ := strconv.Atoi(stm.Get(key(to)))
					if a < amount {
						return nil
					}
					stm.Put(key(from), strconv.Itoa(a-amount))
					stm.Put(key(to), strconv.Itoa(b+amount))
					return nil
				})
				if err != nil {
					mu.Lock()
					failures = append(failures, err)
					mu.Unlock()
					return
				}
			}
		}(int64(w))
	}
	wg.Wait()
	if len(failures) > 0 {
		fail("stm: %v", failures[0])
	}
	all, err := cli.Get(ctx, "/bank/", clientv3.WithPrefix())
	if err != nil {
		fail("sum: %v", err)
	}
	total := 0
	for _, kv := range all.Kvs {
		n, _ := strconv.Atoi(string(kv.Value))
		total += n
	}
	fmt.Printf("TOTAL %d ACCOUNTS %d\n", total, len(all.Kvs))
	if total != 100**accounts {
		fail("total %d, want %d", total, 100**accounts)
	}
}

// load: workers put keys prefix/<worker>/<n> and print each acknowledged one ("ACK key rev");
// a put that fails is retried with the same key (a put is idempotent here) until it is
// acknowledged. A watch on the prefix, started before the load, prints how many distinct keys
// it saw ("WATCHED n") once every acknowledged key was seen, in revision order. A lease kept
// alive throughout must still exist at the end ("LEASE ok").
func load() {
	cli := client()
	defer cli.Close()
	ctx := context.Background()
	// 30 s: long enough for the kill -9, the restart and the client's reconnection on a busy
	// machine (with 5 s a restart under load let the lease expire before the keep-alive came
	// back); a run under load lasts longer than that, so the keep-alive is still what keeps it.
	lease, err := cli.Grant(ctx, 30)
	if err != nil {
		fail("grant: %v", err)
	}
	alive, err := cli.KeepAlive(ctx, lease.ID)
	if err != nil {
		fail("keepalive: %v", err)
	}
	go func() {
		for range alive {
		}
	}()
	start, err := cli.Get(ctx, "/", clientv3.WithCountOnly())
	if err != nil {
		fail("start revision: %v", err)
	}
	watch := cli.Watch(clientv3.WithRequireLeader(ctx), *prefix, clientv3.WithPrefix(),
		clientv3.WithRev(start.Header.Revision+1))
	total := *workers * *count
	seen := make(chan int, 1)
	go func() {
		keys := map[string]bool{}
		last := int64(0)
		for response := range watch {
			if err := response.Err(); err != nil {
				fmt.Printf("WATCH-ERROR %v\n", err)
				continue
			}
			for _, event := range response.Events {
				if event.Kv.ModRevision < last {
					fail("watch went back from %d to %d", last, event.Kv.ModRevision)
				}
				last = event.Kv.ModRevision
				keys[string(event.Kv.Key)] = true
			}
			if len(keys) >= total {
				seen <- len(keys)
				return
			}
		}
	}()
	var wg sync.WaitGroup
	var out sync.Mutex
	for w := 0; w < *workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for n := 0; n < *count; n++ {
				key := fmt.Sprintf("%s%d/%06d", *prefix, w, n)
				for {
					put, err := cli.Put(ctx, key, "v", clientv3.WithLease(lease.ID))
					if err == nil {
						out.Lock()
						fmt.Printf("ACK %s %d\n", key, put.Header.Revision)
						out.Unlock()
						break
					}
					// A lost lease never comes back: say so instead of retrying until the
					// test's hang guard (every other error is retried, as a client would).
					if errors.Is(err, context.Canceled) || errors.Is(err, rpctypes.ErrLeaseNotFound) {
						fail("put: %v", err)
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
		}(w)
	}
	wg.Wait()
	select {
	case n := <-seen:
		fmt.Printf("WATCHED %d\n", n)
	case <-time.After(300 * time.Second): // a hang guard, on a machine that may be busy
		fail("the watch did not see every acknowledged key")
	}
	ttl, err := cli.TimeToLive(ctx, lease.ID)
	if err != nil || ttl.TTL <= 0 {
		fail("lease lost: %v %v", err, ttl)
	}
	fmt.Println("LEASE ok")
}

// auth: a client that logged in with -user/-password (clientv3 calls Authenticate and sends the
// token with every call) puts, reads back, grants a lease and watches; a refused call prints
// its error (DENIED) and exits non-zero.
func auth() {
	cli := client()
	defer cli.Close()
	fmt.Println("CONNECTED")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	check := func(what string, err error) {
		if err != nil {
			fmt.Printf("DENIED %s: %v\n", what, err)
			os.Exit(1)
		}
	}
	watch := cli.Watch(ctx, *prefix, clientv3.WithPrefix())
	_, err := cli.Put(ctx, *prefix+"a", "1")
	check("put", err)
	got, err := cli.Get(ctx, *prefix+"a")
	check("get", err)
	if len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "1" {
		fail("read back %v", got.Kvs)
	}
	fmt.Println("PUT-GET ok")
	lease, err := cli.Grant(ctx, 10)
	check("lease grant", err)
	_, err = cli.Put(ctx, *prefix+"leased", "x", clientv3.WithLease(lease.ID))
	check("put with lease", err)
	_, err = cli.KeepAliveOnce(ctx, lease.ID)
	check("keep-alive", err)
	fmt.Println("LEASE ok")
	for response := range watch {
		check("watch", response.Err())
		if len(response.Events) > 0 {
			fmt.Printf("WATCH %s\n", response.Events[0].Kv.Key)
			return
		}
	}
	fail("watch ended: %v", ctx.Err())
}
