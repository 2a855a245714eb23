// Command interop takes and releases locks the way the libraries lockwarden must
// coexist with do, on command, so tests/interop.rs can drive both sides against the
// same real servers.
//
//	interop s3lock     --endpoint URL --bucket B --key K [--wait D]
//	interop dynamolock --endpoint URL --table T --key K [--owner O] [--lease D] [--heartbeat D] [--wait D]
//	interop kafkakit   --servers H:P[,H:P] --path /P [--wait D] [--ttl MS] [--owner O]
//	interop leader     --kubeconfig F --namespace N --name L --identity I [--lease D] [--renew D] [--retry D]
//	                   [--wait D] [--rounds N --hold D --marker FILE]
//	interop s3lock-lock|s3lock-unlock|dynamo-lock|dynamo-unlock ...   (oneshot.go)
//
// One process is one contender. It writes one event per line on stdout:
//
//	ACQUIRED [detail]   the lock is held
//	BUSY [holder]       one attempt (--wait 0) found the lock held
//	TIMEOUT             --wait ran out
//	QUEUED NAME         (kafkakit) our queue entry
//	WAITING NAME        (kafkakit) watching NAME, the entry just ahead
//	PURGED NAME         (kafkakit --ttl) deleted the entry ahead, its ttl_deadline passed
//	RELEASED            released on request
//	LOST                (leader) leadership ended without a release request
//	HEARTBEAT-STOPPED   (dynamolock) heartbeats stopped on request
//	OVERLAP FILE        (leader --marker) the other side's marker existed: both held
//	DONE                (leader --rounds) every round finished
//	ERROR message       anything else; the exit status is then 1
//
// and reads requests from stdin, one per line: "release", "stop-heartbeat" (dynamolock),
// "quit" (exit without releasing, as a crash would; also on end of input).
//
// Libraries: cirello.io/dynamolock/v2 and k8s.io/client-go's leaderelection are the
// real libraries. github.com/winebarrel/s3lock and github.com/DataDog/kafka-kit/v4 are
// not served by the Go module proxy reachable here, so their lock protocols are
// re-implemented below from their documented behaviour, call for call (see
// docs/backends.md, "Interoperability with existing lock libraries").
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"cirello.io/dynamolock/v2"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/go-zookeeper/zk"
	"github.com/google/uuid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

var out = struct {
	sync.Mutex
	w *bufio.Writer
}{w: bufio.NewWriter(os.Stdout)}

// emit writes one event line and flushes it at once: the test reads them as they come.
func emit(format string, args ...any) {
	out.Lock()
	defer out.Unlock()
	fmt.Fprintf(out.w, format+"\n", args...)
	out.w.Flush()
}

func fail(err error) {
	emit("ERROR %s", strings.ReplaceAll(err.Error(), "\n", " "))
	os.Exit(1)
}

// requests delivers stdin lines; it is closed at end of input.
func requests() <-chan string {
	ch := make(chan string)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			if line := strings.TrimSpace(sc.Text()); line != "" {
				ch <- line
			}
		}
	}()
	return ch
}

// waitFor blocks until the given request arrives; "quit" or end of input exits the
// process without releasing anything.
func waitFor(reqs <-chan string, handlers map[string]func() bool) {
	for req := range reqs {
		if req == "quit" {
			os.Exit(0)
		}
		h, ok := handlers[req]
		if !ok {
			emit("ERROR unknown request %q", req)
			continue
		}
		if h() {
			return
		}
	}
	os.Exit(0)
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: interop s3lock|dynamolock|kafkakit|leader [flags]")
		os.Exit(2)
	}
	cmd, args := os.Args[1], os.Args[2:]
	// Each command declares its flags on fs and parses args.
	fs := flag.NewFlagSet(cmd, flag.ExitOnError)
	switch cmd {
	case "s3lock":
		runS3Lock(fs, args)
	case "dynamolock":
		runDynamolock(fs, args)
	case "kafkakit":
		runKafkaKit(fs, args)
	case "leader":
		runLeader(fs, args)
	case "s3lock-lock", "s3lock-unlock":
		runS3LockOnce(fs, args, cmd == "s3lock-unlock")
	case "dynamo-lock", "dynamo-unlock":
		runDynamoOnce(fs, args, cmd == "dynamo-unlock")
	default:
		fmt.Fprintf(os.Stderr, "interop: unknown library %q\n", cmd)
		os.Exit(2)
	}
}

// awsFlags declares the flags that say where the AWS API is (--endpoint URL of the
// server for api, --region) and returns the client configuration they give, to be
// called once fs is parsed. Credentials come from the environment.
func awsFlags(fs *flag.FlagSet, api string) func() aws.Config {
	endpoint := fs.String("endpoint", "", api+" endpoint URL")
	region := fs.String("region", "us-east-1", "region")
	return func() aws.Config {
		creds := credentials.NewStaticCredentialsProvider(
			envOr("AWS_ACCESS_KEY_ID", "testing"), envOr("AWS_SECRET_ACCESS_KEY", "testing"), "")
		return aws.Config{
			Region:       *region,
			Credentials:  creds,
			BaseEndpoint: aws.String(*endpoint),
		}
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// ---------------------------------------------------------------------------------
// s3lock (github.com/winebarrel/s3lock): the object's presence is the lock.
//   lock:   PUT body=<uuid> If-None-Match: *          (412 → "lock already held")
//   wait:   repeat the lock every interval until the deadline
//   unlock: GET If-Match: <etag> and compare the body with <uuid>, then
//           DELETE If-Match: <etag>

func runS3Lock(fs *flag.FlagSet, args []string) {
	config := awsFlags(fs, "S3")
	bucket := fs.String("bucket", "", "bucket")
	key := fs.String("key", "", "object key")
	wait := fs.Duration("wait", 0, "keep trying this long (0: one attempt)")
	interval := fs.Duration("interval", time.Second, "retry interval (s3lock's LockWaitInterval)")
	_ = fs.Parse(args)

	client := s3.NewFromConfig(config(), func(o *s3.Options) { o.UsePathStyle = true })
	ctx := context.Background()
	id := uuid.NewString()
	deadline := time.Now().Add(*wait)
	var etag string
	for {
		put, err := client.PutObject(ctx, &s3.PutObjectInput{
			Bucket:      bucket,
			Key:         key,
			Body:        strings.NewReader(id),
			IfNoneMatch: aws.String("*"),
		})
		if err == nil {
			etag = aws.ToString(put.ETag)
			break
		}
		if !strings.Contains(err.Error(), "PreconditionFailed") {
			fail(err)
		}
		if *wait == 0 {
			emit("BUSY")
			os.Exit(3)
		}
		if time.Now().After(deadline) {
			emit("TIMEOUT")
			os.Exit(3)
		}
		time.Sleep(*interval)
	}
	emit("ACQUIRED %s", id)

	waitFor(requests(), map[string]func() bool{
		"release": func() bool {
			got, err := client.GetObject(ctx, &s3.GetObjectInput{Bucket: bucket, Key: key, IfMatch: aws.String(etag)})
			if err != nil {
				fail(fmt.Errorf("unlock: %w", err))
			}
			body, err := io.ReadAll(got.Body)
			got.Body.Close()
			if err != nil {
				fail(err)
			}
			if string(body) != id {
				fail(fmt.Errorf("unlock: lock mismatch: body %q", body))
			}
			if _, err := client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: bucket, Key: key, IfMatch: aws.String(etag)}); err != nil {
				fail(fmt.Errorf("unlock: %w", err))
			}
			emit("RELEASED")
			return true
		},
	})
}

// ---------------------------------------------------------------------------------
// dynamolock (cirello.io/dynamolock/v2), the library itself.

func runDynamolock(fs *flag.FlagSet, args []string) {
	config := awsFlags(fs, "DynamoDB")
	table := fs.String("table", "", "table")
	key := fs.String("key", "", "partition key value")
	partitionKey := fs.String("partition-key", "key", "partition key attribute name")
	owner := fs.String("owner", "dynamolock-"+strconv.Itoa(os.Getpid()), "owner name")
	lease := fs.Duration("lease", 3*time.Second, "lease duration")
	heartbeat := fs.Duration("heartbeat", time.Second, "heartbeat period (0: none)")
	wait := fs.Duration("wait", 0, "additional time to wait for the lock (0: fail if locked)")
	data := fs.String("data", "", "lock data")
	deleteOnRelease := fs.Bool("delete-on-release", false, "delete the item on release")
	_ = fs.Parse(args)

	db := dynamodb.NewFromConfig(config())
	// Heartbeats are sent here rather than by the client's own goroutine, so that a
	// request can stop them without releasing (a hung holder).
	c, err := dynamolock.New(db, *table,
		dynamolock.WithLeaseDuration(*lease),
		dynamolock.WithOwnerName(*owner),
		dynamolock.WithHeartbeatPeriod(0),
		dynamolock.WithPartitionKeyName(*partitionKey),
	)
	if err != nil {
		fail(err)
	}
	opts := []dynamolock.AcquireLockOption{dynamolock.WithRefreshPeriod(200 * time.Millisecond)}
	if *data != "" {
		opts = append(opts, dynamolock.WithData([]byte(*data)), dynamolock.ReplaceData())
	}
	if *deleteOnRelease {
		opts = append(opts, dynamolock.WithDeleteLockOnRelease())
	}
	if *wait == 0 {
		opts = append(opts, dynamolock.FailIfLocked())
	} else {
		opts = append(opts, dynamolock.WithAdditionalTimeToWaitForLock(*wait))
	}
	lock, err := c.AcquireLock(*key, opts...)
	if err != nil {
		var notGranted *dynamolock.LockNotGrantedError
		if errors.As(err, &notGranted) {
			if *wait == 0 {
				current, _ := c.Get(*key)
				emit("BUSY %s", current.OwnerName())
			} else {
				emit("TIMEOUT")
			}
			os.Exit(3)
		}
		fail(err)
	}
	emit("ACQUIRED %s", lock.OwnerName())

	stop := make(chan struct{})
	var stopOnce sync.Once
	if *heartbeat > 0 {
		go func() {
			t := time.NewTicker(*heartbeat)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
					if err := c.SendHeartbeat(lock); err != nil {
						emit("HEARTBEAT-FAILED %s", strings.ReplaceAll(err.Error(), "\n", " "))
					}
				}
			}
		}()
	}
	waitFor(requests(), map[string]func() bool{
		"stop-heartbeat": func() bool {
			stopOnce.Do(func() { close(stop) })
			emit("HEARTBEAT-STOPPED")
			return false
		},
		"release": func() bool {
			stopOnce.Do(func() { close(stop) })
			ok, err := c.ReleaseLock(lock)
			if err != nil || !ok {
				fail(fmt.Errorf("release: ok=%v err=%v", ok, err))
			}
			emit("RELEASED")
			return true
		},
	})
}

// ---------------------------------------------------------------------------------
// kafka-kit's ZooKeeper lock (github.com/DataDog/kafka-kit/v4/cluster/zookeeper, as of
// the version with lock TTLs: locking.go, locks.go, zookeeper.go), call for call:
//   init:   create every component of the lock path as a persistent znode
//   lock:   CreateProtectedEphemeralSequential("<path>/lock-", data) → _c_<guid>-lock-<seq>,
//           data = JSON {"timestamp", "ttl_deadline", "owner_id"}: Go time.Time values
//           (RFC 3339) and the owner formatted with %v; ttl_deadline = now + TTL, where
//           the config's TTL is an int of milliseconds (0: TTLs off)
//   loop:   interval++; give up (ErrLockingFailed) once interval > 5 after any error;
//           from the second pass on, sleep 50ms; list the children, take the integer
//           after the last "-" of each name (names without one are ignored), sort;
//           lowest = holder; else, with TTL > 0, Get the entry just ahead and decode
//           its data into the JSON above (a decode error is an error of this pass); if
//           now is not before its ttl_deadline (a missing field is the zero time: always
//           passed) delete it (Get for the version, Delete at it) and look again; else
//           GetW the entry ahead (an error is an error of this pass) and look again when
//           it fires or the context ends (ErrLockingTimedOut)
//   exit:   on every return but success, delete our own entry
//   unlock: Get our znode for its version, Delete it at that version; 3 attempts, 125ms
//           apart

// kafkaKitLockMetadata is the JSON kafka-kit stores in each queue entry.
type kafkaKitLockMetadata struct {
	Timestamp   time.Time `json:"timestamp"`
	TTLDeadline time.Time `json:"ttl_deadline"`
	OwnerID     string    `json:"owner_id"`
}

func runKafkaKit(fs *flag.FlagSet, args []string) {
	servers := fs.String("servers", "", "host:port[,host:port]")
	path := fs.String("path", "", "lock path")
	wait := fs.Duration("wait", 0, "how long to wait in the queue (0: one look)")
	ttl := fs.Int("ttl", 0, "ZooKeeperLockConfig.TTL in milliseconds (0: TTLs off)")
	owner := fs.String("owner", "kafkakit-"+strconv.Itoa(os.Getpid()), "lock owner (owner_id)")
	_ = fs.Parse(args)

	conn, _, err := zk.Connect(strings.Split(*servers, ","), 10*time.Second, zk.WithLogInfo(false))
	if err != nil {
		fail(err)
	}
	lockPath := "/" + strings.Trim(*path, "/")
	parts := strings.Split(strings.Trim(lockPath, "/"), "/")
	for i := range parts {
		p := "/" + strings.Join(parts[:i+1], "/")
		if _, err := conn.Create(p, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			fail(err)
		}
	}
	k := &kafkaKitLock{conn: conn, path: lockPath, ttl: *ttl}
	meta, _ := json.Marshal(kafkaKitLockMetadata{
		Timestamp:   time.Now(),
		TTLDeadline: time.Now().Add(time.Duration(*ttl) * time.Millisecond),
		OwnerID:     *owner,
	})
	node, err := conn.CreateProtectedEphemeralSequential(lockPath+"/lock-", meta, zk.WorldACL(zk.PermAll))
	if err != nil {
		fail(err)
	}
	emit("QUEUED %s", node[strings.LastIndex(node, "/")+1:])
	mine, err := idFromZnode(node)
	if err != nil {
		_ = k.deleteZnode(node)
		fail(err)
	}

	ctx := context.Background()
	if *wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *wait)
		defer cancel()
	}
	var interval int
	var lockWaitingErr error
	for {
		interval++
		if interval > 5 && lockWaitingErr != nil {
			_ = k.deleteZnode(node)
			fail(fmt.Errorf("locking failed: %w", lockWaitingErr))
		}
		if interval > 1 {
			time.Sleep(50 * time.Millisecond)
		}
		ids, order, err := k.locks()
		if err != nil {
			_ = k.deleteZnode(node)
			fail(err)
		}
		if len(order) > 0 && order[0] == mine {
			break
		}
		ahead, err := lockAhead(ids, order, mine)
		if err != nil {
			lockWaitingErr = err
			continue
		}
		expired, err := k.expireIfPassed(ahead)
		if err != nil {
			lockWaitingErr = err
			continue
		}
		if expired {
			continue
		}
		if *wait == 0 {
			// This driver's one-look mode: what a Lock with an already ended context
			// reports, without blocking on the watch.
			_ = k.deleteZnode(node)
			emit("BUSY %s", ids[order[0]])
			os.Exit(3)
		}
		_, _, changed, err := conn.GetW(ahead)
		if err != nil {
			lockWaitingErr = err
			continue
		}
		emit("WAITING %s", ahead[strings.LastIndex(ahead, "/")+1:])
		select {
		case <-ctx.Done():
			_ = k.deleteZnode(node)
			emit("TIMEOUT")
			os.Exit(3)
		case <-changed:
		}
	}
	emit("ACQUIRED %s", node[strings.LastIndex(node, "/")+1:])
	waitFor(requests(), map[string]func() bool{
		"release": func() bool {
			var err error
			for attempt := 0; attempt < 3; attempt++ {
				if err = k.deleteZnode(node); err == nil {
					break
				}
				time.Sleep(125 * time.Millisecond)
			}
			if err != nil {
				fail(fmt.Errorf("unlock: %w", err))
			}
			emit("RELEASED")
			return true
		},
	})
}

type kafkaKitLock struct {
	conn *zk.Conn
	path string
	ttl  int
}

// locks lists the queue: sequence number → znode path, and the numbers ascending.
func (k *kafkaKitLock) locks() (map[int]string, []int, error) {
	children, _, err := k.conn.Children(k.path)
	ids := map[int]string{}
	var order []int
	for _, c := range children {
		id, err := idFromZnode(c)
		if err != nil {
			continue
		}
		ids[id] = k.path + "/" + c
		order = append(order, id)
	}
	sort.Ints(order)
	return ids, order, err
}

func lockAhead(ids map[int]string, order []int, mine int) (string, error) {
	for i, id := range order {
		if id == mine && i > 0 {
			return ids[order[i-1]], nil
		}
	}
	return "", errors.New("unable to determine which lock to enqueue behind")
}

// expireIfPassed purges the entry ahead when TTLs are on and its ttl_deadline passed.
func (k *kafkaKitLock) expireIfPassed(ahead string) (bool, error) {
	if k.ttl == 0 {
		return false, nil
	}
	data, _, err := k.conn.Get(ahead)
	if err != nil {
		return false, fmt.Errorf("expire lock failed: %w", err)
	}
	var meta kafkaKitLockMetadata
	if err := json.Unmarshal(data, &meta); err != nil {
		return false, fmt.Errorf("expire lock failed: %w", err)
	}
	if time.Now().Before(meta.TTLDeadline) {
		return false, nil
	}
	if err := k.deleteZnode(ahead); err != nil {
		return false, fmt.Errorf("expire lock failed: %w", err)
	}
	emit("PURGED %s", ahead[strings.LastIndex(ahead, "/")+1:])
	return true, nil
}

func (k *kafkaKitLock) deleteZnode(p string) error {
	_, st, err := k.conn.Get(p)
	if err != nil {
		return err
	}
	return k.conn.Delete(p, st.Version)
}

func idFromZnode(s string) (int, error) {
	parts := strings.Split(s, "-")
	return strconv.Atoi(parts[len(parts)-1])
}

// ---------------------------------------------------------------------------------
// client-go leader election on a coordination.k8s.io/v1 Lease, the library itself.

func runLeader(fs *flag.FlagSet, args []string) {
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file")
	namespace := fs.String("namespace", "default", "namespace")
	name := fs.String("name", "", "Lease name")
	identity := fs.String("identity", "", "holder identity")
	lease := fs.Duration("lease", 4*time.Second, "LeaseDuration")
	renew := fs.Duration("renew", 3*time.Second, "RenewDeadline")
	retry := fs.Duration("retry", 500*time.Millisecond, "RetryPeriod")
	wait := fs.Duration("wait", 0, "give up if not leading within this time (0: wait forever)")
	rounds := fs.Int("rounds", 1, "lead this many times, each released after --hold")
	hold := fs.Duration("hold", 0, "how long each round leads (0: until a release request)")
	marker := fs.String("marker", "", "file created (exclusively) while leading, removed before releasing")
	_ = fs.Parse(args)

	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fail(err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fail(err)
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: *name, Namespace: *namespace},
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: *identity},
	}
	reqs := requests()
	for round := 0; round < *rounds; round++ {
		ctx, cancel := context.WithCancel(context.Background())
		released := make(chan struct{})
		var waitTimer *time.Timer
		if *wait > 0 {
			waitTimer = time.AfterFunc(*wait, func() {
				emit("TIMEOUT")
				os.Exit(3)
			})
		}
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   *lease,
			RenewDeadline:   *renew,
			RetryPeriod:     *retry,
			ReleaseOnCancel: true,
			Name:            *identity,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(ctx context.Context) {
					if waitTimer != nil {
						waitTimer.Stop()
					}
					if *marker != "" {
						f, err := os.OpenFile(*marker, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
						if err != nil {
							emit("OVERLAP %s", *marker)
							os.Exit(4)
						}
						fmt.Fprintln(f, *identity)
						f.Close()
					}
					emit("ACQUIRED %s", *identity)
					var letGo <-chan time.Time
					if *hold > 0 {
						letGo = time.After(*hold)
					}
					select {
					case <-ctx.Done():
						return // leadership lost: OnStoppedLeading says so
					case <-letGo:
					case req, ok := <-reqs:
						if !ok || req == "quit" {
							os.Exit(0)
						}
					}
					// Stop the work before letting go: the marker must be gone first.
					if *marker != "" {
						_ = os.Remove(*marker)
					}
					close(released)
					cancel()
				},
				OnStoppedLeading: func() {
					select {
					case <-released:
						emit("RELEASED")
					default:
						if *marker != "" {
							_ = os.Remove(*marker)
						}
						emit("LOST")
					}
				},
			},
		})
		if err != nil {
			fail(err)
		}
		le.Run(ctx)
		cancel()
	}
	emit("DONE")
	// Stay until told to quit, so the test decides when this contender is gone.
	for req := range reqs {
		if req == "quit" {
			break
		}
	}
}
