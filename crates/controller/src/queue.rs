//! The DistributedLocks' reconcile queue: what kube-runtime's `applier` does for them —
//! one reconcile per object at a time, requests for a running object run once after it,
//! at most N reconciles in flight, a reconcile's requeue — without its timer on the
//! immediate path.
//!
//! kube-runtime's scheduler puts every request, even one due now, into a `DelayQueue`,
//! whose millisecond deadlines and the runtime's timer tick delay each reconcile by
//! 1–2 ms after its watch event or wake (2.1 ms p50 on an idle runtime here). A
//! same-cluster hand-off passes through two such requests (the holder's deletion, then
//! the waiter's wake), so they were about a tenth of it (docs/benchmarks.md,
//! "Same-cluster hand-off: the reconcile queue"). Here a request due now is ready at
//! once; only a reconcile's own requeue (`Action::requeue`) waits in a `DelayQueue`,
//! where a millisecond does not matter.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{FuturesUnordered, Stream, StreamExt};
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio_util::time::{DelayQueue, delay_queue};
use tracing::Instrument;

/// What a reconcile asks of the queue: when to run it again if nothing else does
/// (kube-runtime's `Action`, whose time cannot be read back).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Action {
    requeue_after: Option<Duration>,
}

impl Action {
    /// Run again after `duration`, unless a request comes sooner.
    pub const fn requeue(duration: Duration) -> Action {
        Action {
            requeue_after: Some(duration),
        }
    }

    /// Run again only on a request (a watch event or a wake).
    pub const fn await_change() -> Action {
        Action {
            requeue_after: None,
        }
    }

    pub fn requeue_after(&self) -> Option<Duration> {
        self.requeue_after
    }
}

type Reconciling<K> = Pin<Box<dyn Future<Output = (ObjectRef<K>, Action)> + Send>>;

/// The objects waiting, running and requeued; the loop in [`run`] drives it.
struct Queue<K: Resource>
where
    K::DynamicType: Eq + Hash,
{
    /// Due now, in the order requested; `ready_set` holds the same objects.
    ready: VecDeque<ObjectRef<K>>,
    ready_set: HashSet<ObjectRef<K>>,
    /// Reconciling now; `true` when a request came meanwhile (it runs once more after).
    running: HashMap<ObjectRef<K>, bool>,
    /// Requeued by their last reconcile, each until its time.
    requeued: DelayQueue<ObjectRef<K>>,
    requeue_keys: HashMap<ObjectRef<K>, delay_queue::Key>,
}

impl<K: Resource> Queue<K>
where
    K::DynamicType: Eq + Hash + Clone,
{
    fn new() -> Self {
        Queue {
            ready: VecDeque::new(),
            ready_set: HashSet::new(),
            running: HashMap::new(),
            requeued: DelayQueue::new(),
            requeue_keys: HashMap::new(),
        }
    }

    /// A request to reconcile `obj` now.
    fn request(&mut self, obj: ObjectRef<K>) {
        if let Some(again) = self.running.get_mut(&obj) {
            *again = true;
            return;
        }
        if let Some(key) = self.requeue_keys.remove(&obj) {
            self.requeued.remove(&key);
        }
        if self.ready_set.insert(obj.clone()) {
            self.ready.push_back(obj);
        }
    }

    /// The next object due now that is not running, marked running.
    fn start_next(&mut self) -> Option<ObjectRef<K>> {
        let obj = self.ready.pop_front()?;
        self.ready_set.remove(&obj);
        self.running.insert(obj.clone(), false);
        Some(obj)
    }

    /// `obj`'s reconcile ended asking for `action`.
    fn finished(&mut self, obj: ObjectRef<K>, action: Action) {
        let requested_meanwhile = self.running.remove(&obj).unwrap_or(false);
        if requested_meanwhile {
            // That run will ask for its own requeue.
            self.request(obj);
        } else if let Some(after) = action.requeue_after() {
            match self.requeue_keys.entry(obj) {
                Entry::Occupied(entry) => self.requeued.reset(entry.get(), after),
                Entry::Vacant(entry) => {
                    let key = self.requeued.insert(entry.key().clone(), after);
                    entry.insert(key);
                }
            }
        }
    }

    /// A requeued object whose time came.
    fn requeue_due(&mut self, obj: ObjectRef<K>) {
        self.requeue_keys.remove(&obj);
        self.request(obj);
    }
}

/// Reconciles the objects of `store` that `requests` name, with `reconcile`, at most
/// `concurrency` at once (objects beyond it wait as references), until `requests` ends
/// and the reconciles in flight have finished. As the applier does, it starts none
/// before `store` has its first list (the objects of that list are requested before
/// the store holds them), and drops a request for an object no longer in `store`.
pub async fn run<K, F, Fut>(
    store: Store<K>,
    requests: impl Stream<Item = ObjectRef<K>>,
    concurrency: usize,
    mut reconcile: F,
) where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
    F: FnMut(Arc<K>) -> Fut,
    Fut: Future<Output = Action> + Send + 'static,
{
    let concurrency = concurrency.max(1);
    let mut queue = Queue::<K>::new();
    let mut in_flight: FuturesUnordered<Reconciling<K>> = FuturesUnordered::new();
    let mut requests = std::pin::pin!(requests.fuse());
    let mut requests_open = true;
    let mut listed = std::pin::pin!(store.wait_until_ready());
    let mut store_ready = false;
    loop {
        while store_ready && in_flight.len() < concurrency {
            let Some(obj) = queue.start_next() else {
                break;
            };
            match store.get(&obj) {
                Some(object) => {
                    let span = tracing::info_span!("reconcile", object = %obj);
                    let reconciling = reconcile(object).instrument(span);
                    in_flight.push(Box::pin(async move { (obj, reconciling.await) }));
                }
                None => queue.finished(obj, Action::await_change()),
            }
        }
        if !requests_open && in_flight.is_empty() {
            return;
        }
        tokio::select! {
            listing = &mut listed, if !store_ready => match listing {
                Ok(()) => store_ready = true,
                // Its watch has ended before the first list: there is nothing to reconcile.
                Err(error) => {
                    tracing::warn!(%error, "the reconcile queue's store ended before its first list");
                    return;
                }
            },
            request = requests.next(), if requests_open => match request {
                Some(obj) => queue.request(obj),
                None => requests_open = false,
            },
            Some((obj, action)) = in_flight.next(), if !in_flight.is_empty() => {
                queue.finished(obj, action);
            }
            Some(due) = queue.requeued.next(), if !queue.requeued.is_empty() => {
                queue.requeue_due(due.into_inner());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher::Event;
    use std::sync::Mutex;
    use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};

    fn object(name: &str) -> ConfigMap {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.to_string());
        cm.metadata.namespace = Some("default".to_string());
        cm
    }

    fn store_of(names: &[&str]) -> Store<ConfigMap> {
        let mut writer = Writer::<ConfigMap>::default();
        writer.apply_watcher_event(&Event::Init);
        for name in names {
            writer.apply_watcher_event(&Event::InitApply(object(name)));
        }
        writer.apply_watcher_event(&Event::InitDone);
        writer.as_reader()
    }

    fn obj(name: &str) -> ObjectRef<ConfigMap> {
        ObjectRef::new(name).within("default")
    }

    /// The reconciles started, in order, and a way to end each.
    struct Script {
        started: Mutex<Vec<String>>,
        /// When each started, on the test's paused clock.
        started_at: Mutex<Vec<tokio::time::Instant>>,
        ends: Mutex<HashMap<String, tokio::sync::oneshot::Sender<Action>>>,
    }

    fn scripted() -> Arc<Script> {
        Arc::new(Script {
            started: Mutex::new(Vec::new()),
            started_at: Mutex::new(Vec::new()),
            ends: Mutex::new(HashMap::new()),
        })
    }

    fn spawn_queue(
        names: &[&str],
        concurrency: usize,
        script: Arc<Script>,
    ) -> UnboundedSender<ObjectRef<ConfigMap>> {
        let (tx, rx) = unbounded_channel();
        let requests =
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|r| (r, rx)) });
        let store = store_of(names);
        tokio::spawn(run(
            store,
            requests,
            concurrency,
            move |cm: Arc<ConfigMap>| {
                let name = cm.metadata.name.clone().unwrap_or_default();
                let (end, ended) = tokio::sync::oneshot::channel();
                script.started.lock().unwrap().push(name.clone());
                script
                    .started_at
                    .lock()
                    .unwrap()
                    .push(tokio::time::Instant::now());
                script.ends.lock().unwrap().insert(name, end);
                async move { ended.await.unwrap_or(Action::await_change()) }
            },
        ));
        tx
    }

    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    fn started(script: &Script) -> Vec<String> {
        script.started.lock().unwrap().clone()
    }

    fn end(script: &Script, name: &str, action: Action) {
        let end = script.ends.lock().unwrap().remove(name).expect("running");
        end.send(action).unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_due_now_runs_without_waiting_for_a_timer() {
        let script = scripted();
        let tx = spawn_queue(&["a"], 4, script.clone());
        // Off the millisecond, where a `DelayQueue` rounds a deadline up to the next one
        // (kube-runtime's scheduler then starts it a millisecond later on this clock).
        tokio::time::advance(Duration::from_micros(300)).await;
        let requested_at = tokio::time::Instant::now();
        tx.send(obj("a")).unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(started(&script), ["a"]);
        // The paused clock moves only when every task waits for a timer: a request that
        // went through one (kube-runtime's scheduler) starts a millisecond or more later.
        let started_at = script.started_at.lock().unwrap()[0];
        assert_eq!(
            started_at - requested_at,
            Duration::ZERO,
            "waited for a timer"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn one_reconcile_per_object_and_a_request_meanwhile_runs_once_after_it() {
        let script = scripted();
        let tx = spawn_queue(&["a"], 4, script.clone());
        tx.send(obj("a")).unwrap();
        settle().await;
        tx.send(obj("a")).unwrap();
        tx.send(obj("a")).unwrap();
        settle().await;
        assert_eq!(
            started(&script),
            ["a"],
            "a second reconcile beside the first"
        );
        end(&script, "a", Action::requeue(Duration::from_secs(300)));
        settle().await;
        assert_eq!(
            started(&script),
            ["a", "a"],
            "the requests meanwhile ran once after"
        );
        end(&script, "a", Action::await_change());
        settle().await;
        tokio::time::advance(Duration::from_secs(600)).await;
        settle().await;
        assert_eq!(
            started(&script).len(),
            2,
            "the first run's requeue outlived the second run"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_requeue_runs_at_its_time_and_a_request_before_it_replaces_it() {
        let script = scripted();
        let tx = spawn_queue(&["a"], 4, script.clone());
        tx.send(obj("a")).unwrap();
        settle().await;
        end(&script, "a", Action::requeue(Duration::from_secs(10)));
        settle().await;
        tokio::time::advance(Duration::from_secs(9)).await;
        settle().await;
        assert_eq!(started(&script).len(), 1, "ran before its requeue's time");
        tokio::time::advance(Duration::from_secs(2)).await;
        settle().await;
        assert_eq!(started(&script).len(), 2, "the requeue did not run");

        end(&script, "a", Action::requeue(Duration::from_secs(10)));
        settle().await;
        tx.send(obj("a")).unwrap();
        settle().await;
        assert_eq!(started(&script).len(), 3, "a request did not run at once");
        end(&script, "a", Action::await_change());
        settle().await;
        tokio::time::advance(Duration::from_secs(20)).await;
        settle().await;
        assert_eq!(started(&script).len(), 3, "the replaced requeue still ran");
    }

    #[tokio::test(start_paused = true)]
    async fn reconciles_beyond_the_bound_wait_in_request_order() {
        let script = scripted();
        let tx = spawn_queue(&["a", "b", "c"], 2, script.clone());
        for name in ["a", "b", "c", "c"] {
            tx.send(obj(name)).unwrap();
        }
        settle().await;
        assert_eq!(started(&script), ["a", "b"]);
        end(&script, "b", Action::await_change());
        settle().await;
        assert_eq!(started(&script), ["a", "b", "c"], "c waited for a slot");
        end(&script, "a", Action::await_change());
        end(&script, "c", Action::await_change());
        settle().await;
        assert_eq!(
            started(&script).len(),
            3,
            "a request waiting twice ran twice"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_runs_before_the_store_has_its_first_list() {
        let script = scripted();
        let mut writer = Writer::<ConfigMap>::default();
        let (tx, rx) = unbounded_channel();
        let requests =
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|r| (r, rx)) });
        let recorder = script.clone();
        tokio::spawn(run(
            writer.as_reader(),
            requests,
            4,
            move |cm: Arc<ConfigMap>| {
                recorder
                    .started
                    .lock()
                    .unwrap()
                    .push(cm.metadata.name.clone().unwrap_or_default());
                async { Action::await_change() }
            },
        ));
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitApply(object("a")));
        // The list's object is requested while the store does not hold it yet.
        tx.send(obj("a")).unwrap();
        settle().await;
        assert!(started(&script).is_empty(), "ran before the first list");
        writer.apply_watcher_event(&Event::InitDone);
        settle().await;
        assert_eq!(
            started(&script),
            ["a"],
            "the request made during the list was lost"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_for_an_object_not_in_the_store_is_dropped() {
        let script = scripted();
        let tx = spawn_queue(&["a"], 1, script.clone());
        tx.send(obj("gone")).unwrap();
        tx.send(obj("a")).unwrap();
        settle().await;
        assert_eq!(started(&script), ["a"]);
    }
}
