//! "Never two at once" (or never more than N, for a key with N permits), checked on
//! every object version: a watch of workloads that records a violation whenever more
//! of them than allowed are free to run.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;

/// Watches from now on (each object version in order, across every `api`) and records
/// a violation whenever `runs` holds for more than one object at once.
pub struct OverlapWatch {
    violations: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl OverlapWatch {
    pub fn start<K>(apis: Vec<Api<K>>, config: watcher::Config, runs: fn(&K) -> bool) -> Self
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        Self::at_most(1, apis, config, runs)
    }

    /// [`start`](Self::start) for a key with `limit` permits: a violation whenever
    /// more than `limit` objects are free to run at once.
    pub fn at_most<K>(
        limit: usize,
        apis: Vec<Api<K>>,
        config: watcher::Config,
        runs: fn(&K) -> bool,
    ) -> Self
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        let violations = Arc::new(Mutex::new(Vec::new()));
        let seen = violations.clone();
        let streams: Vec<_> = apis
            .into_iter()
            .map(|api| watcher(api, config.clone()).applied_objects().boxed())
            .collect();
        let task = tokio::spawn(async move {
            let mut running: BTreeMap<String, bool> = BTreeMap::new();
            let mut all = futures::stream::select_all(streams);
            while let Some(Ok(obj)) = all.next().await {
                let key = format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any());
                running.insert(key, runs(&obj));
                let now: Vec<_> = running
                    .iter()
                    .filter(|(_, r)| **r)
                    .map(|(n, _)| n)
                    .collect();
                if now.len() > limit {
                    seen.lock()
                        .unwrap()
                        .push(format!("{now:?} free to run at once (at most {limit} may)"));
                }
            }
        });
        OverlapWatch { violations, task }
    }

    /// Stops watching; panics with every violation seen.
    pub fn assert_none(self) {
        self.task.abort();
        let v = self.violations.lock().unwrap();
        assert!(v.is_empty(), "too many workloads ran at once: {v:?}");
    }
}
