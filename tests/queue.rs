//! Queues (docs/design.md §6.4) against the real servers, on S3, DynamoDB and Leases:
//! arrival order across two "clusters" and the CLI, a priority overtaking, weights.
//!
//! Orders are asserted, never timings: the grant order is read off the fences (every
//! grant takes the key's next one), and the arrival order is the order in which the
//! test let each contender register (each registration is confirmed in the store
//! before the next contender starts).

use lockwarden_testsupport as support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use lockwarden::api::{
    BackendSpec, DistributedLock, DynamoDbBackend, KubernetesBackend, LockPhase, SecretRef,
};
use lockwarden::lock::{
    AcquireRequest, Attempt, Lease, LockBackend, LockRecord, Permits, Queue, Queueing, Stored,
};
use serde_json::json;
use support::cli::Cli;
use support::keys::Key;
use tokio::time::{Instant, sleep};

/// Far beyond anything a loaded 2-core machine needs for one step.
const GIVE_UP: Duration = Duration::from_secs(120);

fn queued(holder: &str, cluster: &str, priority: i32) -> AcquireRequest {
    AcquireRequest {
        cluster: Some(cluster.into()),
        queue: Some(Queueing {
            priority,
            weight: 1,
        }),
        ..AcquireRequest::new(holder, Duration::from_secs(30))
    }
}

/// The key's record as stored now.
async fn record(key: &Key) -> LockRecord {
    match key.handle().await.inspect().await.expect("read the key") {
        Some(Stored { record: Ok(r), .. }) => r,
        other => panic!("expected a lockwarden record, found {other:?}"),
    }
}

/// The holders registered in the key's queue, in ticket order.
async fn registered(key: &Key) -> Vec<String> {
    let record = record(key).await;
    let mut waiters = record
        .set
        .and_then(|s| s.queue)
        .map(|q| q.waiters)
        .unwrap_or_default();
    waiters.sort_by_key(|w| w.ticket);
    waiters.into_iter().map(|w| w.holder).collect()
}

/// Waits until `holder` is registered in the key's queue.
async fn until_registered(key: &Key, holder: &str) {
    let give_up = Instant::now() + GIVE_UP;
    while !registered(key).await.iter().any(|h| h == holder) {
        assert!(Instant::now() < give_up, "{holder} never registered");
        sleep(Duration::from_millis(50)).await;
    }
}

/// One attempt that must find the key busy and register (or keep) a place.
async fn register(lock: &dyn LockBackend, req: &AcquireRequest) -> u32 {
    let give_up = Instant::now() + GIVE_UP;
    loop {
        match lock.try_acquire(req).await {
            Ok(Attempt::Busy {
                queue_position: Some(p),
                ..
            }) => return p,
            Ok(other) => panic!("{} should have queued: {other:?}", req.holder),
            Err(e) if e.is_transient() => {}
            Err(e) => panic!("{}: {e}", req.holder),
        }
        assert!(Instant::now() < give_up, "{} never registered", req.holder);
        sleep(Duration::from_millis(50)).await;
    }
}

/// Waits for the grant as `lockwarden` does: tries again when the attempt says.
async fn take(lock: &dyn LockBackend, req: &AcquireRequest) -> Lease {
    let give_up = Instant::now() + GIVE_UP;
    loop {
        let pause = match lock.try_acquire(req).await {
            Ok(Attempt::Acquired(lease)) => return lease,
            Ok(Attempt::Busy { retry_in, .. }) => retry_in.unwrap_or(Duration::from_millis(100)),
            Err(e) if e.is_transient() => Duration::from_millis(50),
            Err(e) => panic!("{}: {e}", req.holder),
        };
        assert!(Instant::now() < give_up, "{} never granted", req.holder);
        lock.changed(pause.min(Duration::from_secs(1))).await;
    }
}

/// The grants seen: (fence, holder).
type Grants = Arc<Mutex<Vec<(u64, String)>>>;

/// An engine contender: registers (already done), waits its turn, holds briefly.
async fn engine_contender(lock: Arc<dyn LockBackend>, req: AcquireRequest, grants: Grants) {
    let lease = take(lock.as_ref(), &req).await;
    grants
        .lock()
        .unwrap()
        .push((lease.fence().0, req.holder.clone()));
    sleep(Duration::from_millis(50)).await;
    lock.release(&lease).await.expect("release");
}

/// The CLI as a user runs it: `lockwarden lock URL --queue --wait`, then `unlock`.
async fn cli_contender(cli: Arc<Cli>, url: String, holder: String, grants: Grants) {
    let file = format!("{holder}.lock");
    // Its place comes after up to 21 others, each a hand-off through a controller: on a
    // loaded machine that is minutes, so the command's own 5 min wait bounds it, not the
    // support's usual cap.
    let out = cli
        .run_within(
            Duration::from_secs(360),
            &[
                "lock", &url, "--queue", "--wait", "5m", "--lease", "30s", "--holder", &holder,
                "--output", &file,
            ],
        )
        .await;
    out.ok();
    let fence = cli.read_json(&file)["fence"].as_u64().expect("a fence");
    grants.lock().unwrap().push((fence, holder));
    cli.run(&["unlock", &file]).await.ok();
}

/// Starts CLI contender number `i` and waits until it is registered in the key's queue.
async fn queued_cli(
    key: &Key,
    cli: &Arc<Cli>,
    url: &str,
    i: usize,
    grants: &Grants,
) -> (String, tokio::task::JoinHandle<()>) {
    let holder = format!("cli-{i}");
    let task = tokio::spawn(cli_contender(
        cli.clone(),
        url.to_string(),
        holder.clone(),
        grants.clone(),
    ));
    until_registered(key, &holder).await;
    (holder, task)
}

fn cli_for(key: &Key) -> (Cli, String) {
    match key {
        Key::S3 {
            endpoint,
            bucket,
            key,
        } => (
            Cli::new().with("AWS_ENDPOINT_URL", endpoint.clone()),
            format!("s3://{bucket}/{key}"),
        ),
        Key::Dynamo {
            endpoint,
            table,
            key,
        } => (
            Cli::new().with("AWS_ENDPOINT_URL", endpoint.clone()),
            format!("dynamodb://{table}/{key}"),
        ),
        Key::Lease {
            kubeconfig,
            namespace,
            name,
        } => (
            Cli::new().with("KUBECONFIG", kubeconfig.display().to_string()),
            format!("k8s://{namespace}/{name}"),
        ),
        Key::ZooKeeper { .. } => panic!("ZooKeeper keeps its own queue"),
    }
}

/// A key held by an engine holder while a queue test's contenders arrive one after
/// the other (each registered before the next starts); the CLI for the key; the
/// grants seen.
struct Arrivals {
    key: Key,
    first: Arc<dyn LockBackend>,
    held: Lease,
    cli: Arc<Cli>,
    url: String,
    grants: Grants,
    /// The contenders' holder names, in the order they registered.
    order: Vec<String>,
    /// The contenders that run in tasks of their own.
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Arrivals {
    async fn new(key: Key) -> Arrivals {
        let first = key.handle().await;
        // Nobody renews this holder, and the contenders arrive one at a time (each
        // registered before the next): on a loaded machine 22 arrivals outlast a 30 s
        // lease, and a takeover by expiry would reorder the queue under the test. The
        // order is what is tested, so the first holds until it lets go.
        let mut first_request = queued("first", "east", 0);
        first_request.lease = Duration::from_secs(600);
        let held = take(first.as_ref(), &first_request).await;
        let (cli, url) = cli_for(&key);
        Arrivals {
            key,
            first,
            held,
            cli: Arc::new(cli),
            url,
            grants: Grants::default(),
            order: Vec::new(),
            tasks: Vec::new(),
        }
    }

    /// CLI contender number `i` arrives.
    async fn cli_arrives(&mut self, i: usize) {
        let (holder, task) = queued_cli(&self.key, &self.cli, &self.url, i, &self.grants).await;
        self.tasks.push(task);
        self.order.push(holder);
    }

    /// The engine holder lets go.
    async fn release_the_first(&self) {
        self.first.release(&self.held).await.unwrap();
    }

    /// Once every task is done: sorted by fence, the grants are the arrival order.
    async fn assert_granted_in_arrival_order(self) {
        for task in self.tasks {
            task.await.expect("a contender failed");
        }
        let mut grants = self.grants.lock().unwrap().clone();
        grants.sort();
        let order: Vec<String> = grants.into_iter().map(|(_, h)| h).collect();
        assert_eq!(order, self.order, "granted out of arrival order");
    }
}

/// The holders `lockwarden status` lists in the key's queue.
async fn status_queue(cli: &Cli, url: &str) -> Vec<String> {
    let out = cli.run(&["status", url, "-o", "json"]).await;
    let status: serde_json::Value = serde_json::from_str(&out.ok().stdout).expect("JSON");
    let queue = status["queue"].as_array().expect("a queue in status");
    queue
        .iter()
        .map(|w| w["holder"].as_str().unwrap().to_string())
        .collect()
}

/// 20 engine contenders of two clusters and 2 CLI `lock --queue --wait` processes
/// register one after the other while the key is held; then all of them wait at once.
/// Sorted by fence, the grants are the arrival order.
async fn arrival_order_across_clusters(key: Key) {
    let mut q = Arrivals::new(key).await;
    for i in 0..22 {
        if i == 5 || i == 16 {
            q.cli_arrives(i).await;
            continue;
        }
        let cluster = if i % 2 == 0 { "east" } else { "west" };
        let holder = format!("{cluster}/team/lock-{i}");
        let req = queued(&holder, cluster, 0);
        let lock = q.key.handle().await;
        register(lock.as_ref(), &req).await;
        let grants = q.grants.clone();
        q.tasks
            .push(tokio::spawn(engine_contender(lock, req, grants)));
        q.order.push(holder);
    }
    assert_eq!(
        registered(&q.key).await,
        q.order,
        "tickets follow registration"
    );
    // `lockwarden status` lists the queue in grant order.
    assert_eq!(
        status_queue(&q.cli, &q.url).await,
        q.order,
        "lockwarden status lists the queue in order"
    );
    q.release_the_first().await;
    q.assert_granted_in_arrival_order().await;
}

/// One test per store of a body: `#[test] body: on_s3, on_dynamodb, on_a_lease` runs
/// `body` on a key of S3, DynamoDB and a Lease in the tests named so.
macro_rules! on_each_store {
    (#[$test:meta] $body:ident: $s3:ident, $dynamodb:ident, $lease:ident $(,)?) => {
        #[$test]
        async fn $s3() {
            $body(Key::s3().await).await;
        }

        #[$test]
        async fn $dynamodb() {
            $body(Key::dynamo().await).await;
        }

        #[$test]
        async fn $lease() {
            $body(Key::lease().await).await;
        }
    };
}

on_each_store!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    arrival_order_across_clusters:
    order_grants_follow_arrival_across_clusters_and_the_cli_on_s3,
    order_grants_follow_arrival_across_clusters_and_the_cli_on_dynamodb,
    order_grants_follow_arrival_across_clusters_and_the_cli_on_a_lease,
);

/// A later waiter with a higher priority goes next; the holder is not preempted; the
/// overtaken waiter's count is in the record.
async fn priority_overtakes(key: Key) {
    let (la, low, high) = (key.handle().await, key.handle().await, key.handle().await);
    let a = take(la.as_ref(), &queued("a", "east", 0)).await;
    let low_req = queued("low", "east", 0);
    let high_req = queued("high", "west", 10);
    assert_eq!(register(low.as_ref(), &low_req).await, 0);
    assert_eq!(register(high.as_ref(), &high_req).await, 0);
    assert_eq!(record(&key).await.set.unwrap().holders[0].holder, "a");
    la.release(&a).await.unwrap();
    let h = take(high.as_ref(), &high_req).await;
    let set = record(&key).await.set.unwrap();
    let waiter = &set.queue.as_ref().unwrap().waiters[0];
    assert_eq!((waiter.holder.as_str(), waiter.overtaken), ("low", 1));
    high.release(&h).await.unwrap();
    let l = take(low.as_ref(), &low_req).await;
    assert!(l.fence() > h.fence());
}

on_each_store!(
    #[tokio::test]
    priority_overtakes:
    priority_a_later_higher_priority_waiter_is_granted_next_on_s3,
    priority_a_later_higher_priority_waiter_is_granted_next_on_dynamodb,
    priority_a_later_higher_priority_waiter_is_granted_next_on_a_lease,
);

/// The same through the controller: a queued DistributedLock with `spec.priority: 10`
/// created after one with none is granted first, the engine holder is not preempted,
/// and the passed-over lock's status shows `overtaken: 1` while it waits at position 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn priority_the_overtaken_count_shows_in_a_waiting_locks_status() {
    let key = Key::lease().await;
    let (client, ns) = support::kube::namespace_with_controller("queue-prio", "cluster-a").await;
    let api: Api<DistributedLock> = Api::namespaced(client, &ns);
    let first = key.handle().await;
    let held = take(first.as_ref(), &queued("first", "east", 0)).await;
    let status_of = |name: &'static str| {
        let api = api.clone();
        async move { api.get(name).await.ok().and_then(|l| l.status) }
    };
    api.create(&PostParams::default(), &queued_lock("low", &key, false))
        .await
        .expect("create the low-priority lock");
    until_registered(&key, &format!("cluster-a/{ns}/low")).await;
    let mut high = queued_lock("high", &key, false);
    high.spec.priority = Some(10);
    api.create(&PostParams::default(), &high)
        .await
        .expect("create the high-priority lock");
    until_registered(&key, &format!("cluster-a/{ns}/high")).await;
    assert_eq!(record(&key).await.set.unwrap().holders[0].holder, "first");
    first.release(&held).await.unwrap();
    let high = support::eventually("the high-priority lock held", GIVE_UP, || async {
        let s = status_of("high").await?;
        (s.phase == Some(LockPhase::Held)).then_some(s)
    })
    .await;
    let low = support::eventually("the low lock's overtaken count", GIVE_UP, || async {
        let s = status_of("low").await?;
        (s.overtaken == Some(1) && s.queue_position == Some(0)).then_some(s)
    })
    .await;
    assert_ne!(
        low.phase,
        Some(LockPhase::Held),
        "low was granted alongside"
    );
    api.patch(
        "high",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"release": true}})),
    )
    .await
    .expect("release the high-priority lock");
    let low = support::eventually("the low-priority lock held", GIVE_UP, || async {
        let s = status_of("low").await?;
        (s.phase == Some(LockPhase::Held)).then_some(s)
    })
    .await;
    assert!(low.fence > high.fence, "fences follow the grants");
}

/// Permits 4, 24 requests of weight 3 and 1 interleaved, each taken, held briefly and
/// released: never more than 4 permits in use (checked on every grant against the
/// live holds), every request granted.
async fn weights(key: Key) {
    let in_use = Arc::new(Mutex::new(0u32));
    let mut tasks = Vec::new();
    for i in 0..24u32 {
        let weight = if i % 2 == 0 { 3 } else { 1 };
        let req = AcquireRequest {
            permits: Permits::semaphore(4),
            queue: Some(Queueing {
                priority: 0,
                weight,
            }),
            ..AcquireRequest::new(format!("w{i}-of-{weight}"), Duration::from_secs(30))
        };
        let lock = key.handle().await;
        let in_use = in_use.clone();
        tasks.push(tokio::spawn(async move {
            let lease = take(lock.as_ref(), &req).await;
            {
                let mut n = in_use.lock().unwrap();
                *n += weight;
                assert!(*n <= 4, "{n} permits in use after granting {}", req.holder);
            }
            sleep(Duration::from_millis(30)).await;
            *in_use.lock().unwrap() -= weight;
            lock.release(&lease).await.expect("release");
        }));
    }
    for task in tasks {
        task.await.expect("a weighted request failed");
    }
}

on_each_store!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    weights:
    weights_never_exceed_the_permits_and_every_heavy_request_is_granted_on_s3,
    weights_never_exceed_the_permits_and_every_heavy_request_is_granted_on_dynamodb,
    weights_never_exceed_the_permits_and_every_heavy_request_is_granted_on_a_lease,
);

/// A queued DistributedLock on `key`, named `name` in its cluster's namespace.
fn queued_lock(name: &str, key: &Key, aws_secret: bool) -> DistributedLock {
    let mut lock = match key {
        Key::Lease {
            namespace,
            name: lease,
            ..
        } => {
            let mut lock = support::locks::lease_lock(name, lease);
            lock.spec.backend.kubernetes = Some(KubernetesBackend {
                lease_name: lease.clone(),
                namespace: Some(namespace.clone()),
            });
            lock
        }
        Key::S3 {
            endpoint,
            bucket,
            key,
        } => {
            assert!(aws_secret, "an S3 lock needs the aws Secret");
            support::locks::s3_lock(name, bucket, key, endpoint.clone(), "aws")
        }
        Key::Dynamo {
            endpoint,
            table,
            key,
        } => {
            assert!(aws_secret, "a DynamoDB lock needs the aws Secret");
            let mut lock = support::locks::lease_lock(name, "unused");
            lock.spec.backend = BackendSpec {
                dynamodb: Some(DynamoDbBackend {
                    table: table.clone(),
                    key: key.clone(),
                    region: Some(support::moto::REGION.into()),
                    endpoint: Some(endpoint.clone()),
                    credentials_secret_ref: Some(SecretRef { name: "aws".into() }),
                    ..Default::default()
                }),
                ..Default::default()
            };
            lock
        }
        Key::ZooKeeper { .. } => panic!("a ZooKeeper key keeps its own queue"),
    };
    lock.spec.queue = true;
    lock
}

/// Two controllers (cluster-a, cluster-b) with 10 queued DistributedLocks each on one
/// key, and 2 CLI `lock --queue --wait` processes, register one after the other while
/// an engine holder holds the key; then the holder lets go and the test releases each
/// lock as soon as its status says Held. Sorted by fence, the grants are the arrival
/// order. While they wait, their status shows their place: position and length.
async fn queued_locks_of_two_controllers_are_granted_in_arrival_order(key: Key) {
    let (client, ns_a) = support::kube::namespace_with_controller("queue-a", "cluster-a").await;
    let (_, ns_b) = support::kube::namespace_with_controller("queue-b", "cluster-b").await;
    let aws = matches!(key, Key::S3 { .. } | Key::Dynamo { .. });
    if aws {
        support::locks::aws_secret(&client, &ns_a).await;
        support::locks::aws_secret(&client, &ns_b).await;
    }
    let mut q = Arrivals::new(key).await;
    let mut locks = Vec::new();
    for i in 0..22 {
        if i == 7 || i == 14 {
            q.cli_arrives(i).await;
            continue;
        }
        let (cluster, namespace) = if i % 2 == 0 {
            ("cluster-a", &ns_a)
        } else {
            ("cluster-b", &ns_b)
        };
        let name = format!("lock-{i}");
        let api: Api<DistributedLock> = Api::namespaced(client.clone(), namespace);
        api.create(&PostParams::default(), &queued_lock(&name, &q.key, aws))
            .await
            .expect("create a queued lock");
        let holder = format!("{cluster}/{namespace}/{name}");
        until_registered(&q.key, &holder).await;
        locks.push((api, name, holder.clone()));
        q.order.push(holder);
    }
    // The status of a waiter shows its place: the last one is behind everyone. Waited
    // for, not read once: on a loaded machine a waiter whose refreshes are crowded out
    // for its waiter lease is dropped by the others and registers again with its
    // ticket (docs/design.md §6.4), and for that moment every place behind it reads one
    // less. A place that never comes right fails here; each place seen is printed.
    let (api, name, _) = locks.last().unwrap();
    let last_seen = Mutex::new(None);
    support::eventually("the last to arrive at place 21 of 22", GIVE_UP, || async {
        let status = api.get(name).await.ok()?.status?;
        let place = (status.queue_position?, status.queue_length?);
        if last_seen.lock().unwrap().replace(place) != Some(place) {
            println!("queue: the last to arrive shows place {place:?}");
        }
        (place == (21, 22)).then_some(())
    })
    .await;
    q.release_the_first().await;
    // Release each lock as soon as it holds the key.
    let give_up = Instant::now() + GIVE_UP * 2;
    let mut pending: Vec<_> = locks;
    while !pending.is_empty() {
        let mut still = Vec::new();
        for (api, name, holder) in pending {
            let status = api.get(&name).await.expect("get the lock").status;
            match status.filter(|s| s.phase == Some(LockPhase::Held)) {
                Some(s) => {
                    let fence = s.fence.expect("a held lock's fence") as u64;
                    q.grants.lock().unwrap().push((fence, holder));
                    api.patch(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"spec": {"release": true}})),
                    )
                    .await
                    .expect("release the lock");
                }
                None => still.push((api, name, holder)),
            }
        }
        pending = still;
        assert!(
            Instant::now() < give_up,
            "{} locks never held",
            pending.len()
        );
        sleep(Duration::from_millis(100)).await;
    }
    q.assert_granted_in_arrival_order().await;
}

on_each_store!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    queued_locks_of_two_controllers_are_granted_in_arrival_order:
    order_queued_locks_of_two_controllers_and_the_cli_are_granted_in_arrival_order_on_s3,
    order_queued_locks_of_two_controllers_and_the_cli_are_granted_in_arrival_order_on_dynamodb,
    order_queued_locks_of_two_controllers_and_the_cli_are_granted_in_arrival_order_on_a_lease,
);

/// Spawns the CLI with `args` in a process group of its own, to SIGKILL whole.
fn spawn_killable(cli: &Cli, args: &[&str]) -> tokio::process::Child {
    let mut cmd = cli.command(args);
    cmd.process_group(0);
    cmd.spawn().expect("spawn lockwarden")
}

/// SIGKILLs the process group `child` leads (the CLI and what it started).
fn sigkill_group(child: &tokio::process::Child) {
    let pid = child.id().expect("a running child") as i32;
    // SAFETY: kill(2) with a negative pid signals that process group; no memory is
    // touched.
    let sent = unsafe { libc::kill(-pid, libc::SIGKILL) };
    assert_eq!(sent, 0, "kill the process group {pid}");
}

/// Rule 1 on the entry: a `lockwarden run --queue` holder is SIGKILLed while 10 queued
/// waiters keep refreshing their entries (each refresh a new record version); the
/// head is granted once the dead holder's own entry went unrenewed, the others after
/// it in order. Then a CLI waiter at the head is SIGKILLed: it stops blocking after
/// its waiter lease and the next waiter is granted; the dead waiter never holds.
async fn dead_holder_and_dead_waiter(key: Key) {
    let (cli, url) = cli_for(&key);
    let mut holder = spawn_killable(
        &cli,
        &[
            "run", &url, "--queue", "--lease", "3s", "--holder", "doomed", "--", "sleep", "600",
        ],
    );
    let give_up = Instant::now() + GIVE_UP;
    loop {
        let stored = key.handle().await.inspect().await.expect("read the key");
        if let Some(Stored { record: Ok(r), .. }) = stored
            && r.set
                .is_some_and(|s| s.holders.iter().any(|h| h.holder == "doomed"))
        {
            break;
        }
        assert!(Instant::now() < give_up, "the CLI holder never acquired");
        sleep(Duration::from_millis(50)).await;
    }
    let doomed_fence = record(&key).await.fence.0;
    let mut waiters = Vec::new();
    for i in 0..10 {
        let req = queued(&format!("w{i}"), "east", 0);
        let lock = key.handle().await;
        register(lock.as_ref(), &req).await;
        waiters.push((lock, req));
    }
    sigkill_group(&holder);
    holder.wait().await.expect("reap the holder");
    // Every waiter keeps refreshing (take() tries again as each attempt says); the
    // grants come in arrival order after the dead holder's entry expired.
    let grants: Grants = Arc::default();
    let tasks: Vec<_> = waiters
        .into_iter()
        .map(|(lock, req)| tokio::spawn(engine_contender(lock, req, grants.clone())))
        .collect();
    for task in tasks {
        task.await.expect("a waiter failed");
    }
    let mut grants = grants.lock().unwrap().clone();
    grants.sort();
    assert_eq!(
        grants[0],
        (doomed_fence + 1, "w0".to_string()),
        "the head took over"
    );
    let order: Vec<String> = grants.into_iter().map(|(_, h)| h).collect();
    let arrival: Vec<String> = (0..10).map(|i| format!("w{i}")).collect();
    assert_eq!(order, arrival);

    // A dead waiter at the head. Its waiter lease is its lease, at most 30 s: 3 s, as
    // the dead holder's above, so the wait for it to stop blocking is short (the rule
    // holds at any lease).
    let first = key.handle().await;
    let held = take(first.as_ref(), &queued("first", "east", 0)).await;
    let mut dead = spawn_killable(
        &cli,
        &[
            "lock",
            &url,
            "--queue",
            "--wait",
            "5m",
            "--lease",
            "3s",
            "--holder",
            "dead-waiter",
            "--output",
            "dead.lock",
        ],
    );
    until_registered(&key, "dead-waiter").await;
    let (next, next_req) = (key.handle().await, queued("next", "west", 0));
    assert_eq!(register(next.as_ref(), &next_req).await, 1);
    sigkill_group(&dead);
    dead.wait().await.expect("reap the dead waiter");
    first.release(&held).await.unwrap();
    let granted = take(next.as_ref(), &next_req).await;
    assert_eq!(granted.record.holder, "next");
    assert!(
        registered(&key).await.is_empty(),
        "the dead waiter was dropped"
    );
    assert!(
        !cli.path("dead.lock").exists(),
        "the dead waiter never held"
    );
    next.release(&granted).await.unwrap();
}

on_each_store!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    dead_holder_and_dead_waiter:
    rule1_per_entry_a_dead_holder_and_a_dead_waiter_stop_blocking_the_queue_on_s3,
    rule1_per_entry_a_dead_holder_and_a_dead_waiter_stop_blocking_the_queue_on_dynamodb,
    rule1_per_entry_a_dead_holder_and_a_dead_waiter_stop_blocking_the_queue_on_a_lease,
);

/// A key deleted on release (`--s3lock-compatible`) has no record while nobody holds
/// it, so it cannot keep a queue: `lock --queue` on it is refused as a flag conflict
/// (exit 2, as every other), naming why, and writes nothing; so is `run`.
#[tokio::test]
async fn a_queue_is_refused_on_a_key_deleted_on_release() {
    let key = Key::s3().await;
    let (cli, url) = cli_for(&key);
    let out = cli
        .run(&[
            "lock",
            &url,
            "--queue",
            "--s3lock-compatible",
            "--wait",
            "5s",
        ])
        .await;
    out.expect(
        2,
        &[
            "--queue with --s3lock-compatible",
            "a key deleted on release has no record",
        ],
        "lock: queue on s3lock-compatible",
    );
    let out = cli
        .run(&["run", &url, "--queue", "--s3lock-compatible", "--", "true"])
        .await;
    out.expect(
        2,
        &["--queue with --s3lock-compatible"],
        "run: queue on s3lock-compatible",
    );
    let stored = key.handle().await.inspect().await.expect("read the key");
    assert!(stored.is_none(), "nothing written: {stored:?}");
}

/// Bad input: a queue at its bound. With `Queue::MAX_WAITERS` waiters registered, a CLI
/// `lock --queue` waits without a place, says why (once), and ends busy when its wait
/// is over; it never registers, and every registered waiter keeps its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_input_a_queue_at_its_bound_leaves_a_newcomer_without_a_place_and_says_so() {
    let key = Key::s3().await;
    let first = key.handle().await;
    let _held = take(first.as_ref(), &queued("first", "east", 0)).await;
    let mut waiters = Vec::new();
    for i in 0..Queue::MAX_WAITERS {
        let lock = key.handle().await;
        assert_eq!(
            register(lock.as_ref(), &queued(&format!("w{i}"), "east", 0)).await,
            i as u32
        );
        waiters.push(lock);
    }
    let (cli, url) = cli_for(&key);
    let out = cli
        .run(&["lock", &url, "--queue", "--wait", "3s", "--holder", "late"])
        .await;
    out.expect(
        3,
        &["at its bound (256 waiters", "waiting without a place"],
        "a queue at its bound",
    );
    assert_eq!(
        out.stderr.matches("at its bound").count(),
        1,
        "said once: {}",
        out.stderr
    );
    let registered = registered(&key).await;
    assert_eq!(
        registered.len(),
        Queue::MAX_WAITERS,
        "a waiter lost its place"
    );
    assert!(
        !registered.iter().any(|h| h == "late"),
        "registered beyond the bound"
    );
}
