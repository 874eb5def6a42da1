package main

// What each protocol promises a client, as TableKeeper serves it (the README's "Reliability"
// section says the same in words). The checker holds every history to exactly this.

// ReadGuarantee is what a read may return.
type ReadGuarantee int

const (
	// Linearizable: the state at one instant between the read's call and its return (never
	// older than a write that completed before the read began).
	Linearizable ReadGuarantee = iota
	// SequentialPerSession: a state the key really had, no older than the newest state this
	// session already saw (read or wrote); possibly older than other sessions' completed
	// writes. Writes are still linearizable. (ZooKeeper's promise: reads are served by the
	// server a session is connected to, which may be behind the leader.)
	SequentialPerSession
)

// CasField is what a conditional write compares.
type CasField int

const (
	CasVersion CasField = iota // the key's version (a count of its writes)
	CasModrev                  // the revision of the key's last write (Oxia's version id)
)

type Guarantee struct {
	// The version a key gets when it is created (then +1 per write).
	VersionBase int64
	CasOn       CasField
	Reads       ReadGuarantee
	// How a read asked for as "serializable" is held (etcd's serializable option).
	SerializableReads ReadGuarantee
	// Whether a write's answer reports the key's new version and mod revision.
	Describe string
}

var guarantees = map[string]Guarantee{
	// The SDK over the BookKeeper protocol: reads and writes go to the range's owner; the
	// owner serves only while it holds its ZooKeeper session and its log (fencing).
	"sdk": {VersionBase: 0, CasOn: CasVersion, Reads: Linearizable, SerializableReads: Linearizable,
		Describe: "BookKeeper protocol (SDK): linearizable reads and writes"},
	// etcd v3: linearizable by default. etcd itself lets a serializable read be stale (served
	// by any member); TableKeeper serves it from the keyspace's owner like a linearizable one
	// and promises the same, so the checker holds it to that.
	"etcd": {VersionBase: 1, CasOn: CasVersion, Reads: Linearizable, SerializableReads: Linearizable,
		Describe: "etcd v3: linearizable reads (serializable ones too, on TableKeeper) and writes"},
	// Oxia: every call goes to the shard's leader; conditional writes compare the version id
	// (the revision of the key's last write).
	"oxia": {VersionBase: 0, CasOn: CasModrev, Reads: Linearizable, SerializableReads: Linearizable,
		Describe: "Oxia: linearizable reads and writes per shard"},
	// ZooKeeper: writes linearizable, reads sequentially consistent per session.
	"zk": {VersionBase: 0, CasOn: CasVersion, Reads: SequentialPerSession,
		SerializableReads: SequentialPerSession,
		Describe:          "ZooKeeper: linearizable writes, reads sequential per session"},
}
