//! Job gating (docs/design.md §6) against a real kube-apiserver, with the controller running
//! in-process, scoped to each test's own namespace; and every manifest in `examples/`
//! applied with kubectl and driven to the state its opening comment promises.
//!
//! The shared control plane runs kube-controller-manager, so the real Job controller
//! creates each started Job's Pods (they stay Pending: no scheduler or kubelet) and
//! deletes them when a Job is suspended. Tests check the fence on those Pods, and
//! finish a Job by setting its Pods' phase as a kubelet would; the Job controller then
//! marks the Job `Complete` or `Failed`.

use lockwarden_testsupport as support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use lockwarden::api::{DistributedLock, LockPhase};
use lockwarden::controller::FINALIZER;
use lockwarden::controller::jobs::{
    CLAIM_ANNOTATION, FENCE_ANNOTATION, FENCES_ANNOTATION, HOLDER_ANNOTATION, LOCK_ANNOTATION,
    LOCKS_ANNOTATION, LOST_FENCE_ANNOTATION, LOST_GRACE_ANNOTATION, ON_LOCK_LOST_ANNOTATION,
    PRIORITY_ANNOTATION, STATUS_ANNOTATION, TEMPLATE_ANNOTATION, per_job_lock_name,
};
use lockwarden::lock::{AcquireRequest, LockBackend};
use serde_json::json;
use support::eventually;
use support::kube::{ControlPlane, create, delete, wait_event};
use support::locks::{acquired, hold_lease, lease_lock, lease_template, phase, wait_phase};
use support::overlap::OverlapWatch;
use support::workloads::{self, BadRow, Workload, create_held};

/// Generous: the test machine is a loaded 2-core box.
const TIMEOUT: Duration = Duration::from_secs(90);
const CLUSTER: &str = "jobs-cluster";

/// A client, the CRD, a fresh namespace, a controller watching that namespace, and the
/// namespace's locks and Jobs.
async fn setup(prefix: &str) -> (Client, String, Api<DistributedLock>, Api<Job>) {
    workloads::namespace_for(prefix, CLUSTER).await
}

fn is_suspended(job: &Job) -> bool {
    job.is_held()
}

fn template_annotations(job: &Job) -> BTreeMap<String, String> {
    job.spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.annotations.clone())
        .unwrap_or_default()
}

fn fence_of(job: &Job) -> i64 {
    job.fence()
        .unwrap_or_else(|| panic!("{} has no fence annotation", job.name_any()))
}

/// Unsuspended, and started for real: the Job controller made its Pods from the
/// template, fence and all.
async fn wait_unsuspended(jobs: &Api<Job>, name: &str) -> Job {
    Job::wait_started(jobs, name).await
}

/// Of two Jobs, (the running one, the suspended one), when exactly one runs.
fn one_running(a: Job, b: Job) -> Option<(Job, Job)> {
    match (is_suspended(&a), is_suspended(&b)) {
        (false, true) => Some((a, b)),
        (true, false) => Some((b, a)),
        _ => None,
    }
}

/// Another lock, `forcer`, takes Lease `lease` by force; waits until it holds it.
async fn force(locks: &Api<DistributedLock>, lease: &str) -> DistributedLock {
    let mut forcer = lease_lock("forcer", lease);
    forcer.spec.force = true;
    create(locks, &forcer).await;
    wait_acquired(locks, "forcer").await
}

/// Finishes a Job the way a cluster does: its Pods end (the test plays the kubelet,
/// setting their phase), and the real Job controller marks the Job `Complete` or
/// `Failed`. Waits for that condition.
async fn finish(jobs: &Api<Job>, name: &str, succeeded: bool) {
    let client = jobs.clone().into_client();
    let ns = jobs.get(name).await.unwrap().namespace().unwrap();
    support::kube::finish_pods(&client, &ns, name, succeeded).await;
    let want = if succeeded { "Complete" } else { "Failed" };
    eventually(
        &format!("the Job controller to mark Job {name} {want}"),
        TIMEOUT,
        || async {
            let job = jobs.get(name).await.ok()?;
            (lockwarden::controller::jobs::finished(&job) == Some(want)).then_some(())
        },
    )
    .await;
}

/// Waits until lock `name` (`whose`: the Job it belonged to) has been deleted.
async fn wait_lock_gone(locks: &Api<DistributedLock>, name: &str, whose: &str) {
    eventually(&format!("{whose} lock to be deleted"), TIMEOUT, || async {
        locks.get_opt(name).await.unwrap().is_none().then_some(())
    })
    .await;
}

/// Unsuspended and not finished: a Job that may be running.
fn job_runs(job: &Job) -> bool {
    !is_suspended(job) && lockwarden::controller::jobs::finished(job).is_none()
}

/// Never two Jobs of the namespace running at once, from now on.
fn overlap_watch(jobs: Api<Job>) -> OverlapWatch {
    OverlapWatch::start(vec![jobs], watcher::Config::default(), job_runs)
}

/// Two Jobs on one template: each gets its own lock (copied spec, unique holder, owned
/// by its Job); exactly one is unsuspended, the other waits naming the first's holder;
/// only after the first completes does the second start, with a higher fence. Every
/// object version of the Jobs is watched: never two running at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn template_queued_jobs_run_one_at_a_time() {
    let (_, ns, locks, jobs) = setup("jobs-queue").await;
    let watch = overlap_watch(jobs.clone());

    let mut template = lease_template("batch", "batch-key");
    template.spec.data = Some("copied".into());
    create(&locks, &template).await;
    for name in ["first", "second"] {
        create_held(&jobs, name, &[(TEMPLATE_ANNOTATION, "batch")]).await;
    }
    let (running, _) = eventually("one of the two Jobs to be unsuspended", TIMEOUT, || async {
        one_running(
            jobs.get("first").await.ok()?,
            jobs.get("second").await.ok()?,
        )
    })
    .await;
    let waiting_name = if running.name_any() == "first" {
        "second"
    } else {
        "first"
    };
    let running_lock = locks.get(&per_job_lock_name(&running)).await.unwrap();
    let fence = fence_of(&running);
    let holder = template_annotations(&running)[HOLDER_ANNOTATION].clone();
    assert!(acquired(&running_lock));
    assert_eq!(running_lock.status.as_ref().unwrap().fence, Some(fence));
    assert_eq!(
        running_lock.status.as_ref().unwrap().holder.as_ref(),
        Some(&holder)
    );
    assert_eq!(
        holder,
        format!(
            "{CLUSTER}/{ns}/job/{}/{}",
            running.name_any(),
            running.uid().unwrap()
        )
    );
    // The per-Job lock: the template's spec, owned by its Job, never a release.
    assert_eq!(running_lock.spec.data.as_deref(), Some("copied"));
    assert!(!running_lock.spec.release);
    let owner = &running_lock.owner_references()[0];
    assert_eq!(
        (
            owner.kind.as_str(),
            owner.uid.as_str(),
            owner.controller,
            owner.block_owner_deletion
        ),
        (
            "Job",
            running.uid().unwrap().as_str(),
            Some(true),
            Some(true)
        )
    );
    assert!(running.finalizers().iter().any(|f| f == FINALIZER));

    // The other one waits, saying for whom.
    let waiting = jobs.get(waiting_name).await.unwrap();
    let waiting_lock_name = per_job_lock_name(&waiting);
    eventually(
        "the second Job to say it waits for the holder",
        TIMEOUT,
        || async {
            let job = jobs.get(waiting_name).await.ok()?;
            let status = job.annotations().get(STATUS_ANNOTATION)?.clone();
            (is_suspended(&job) && status.contains(&format!("held by {holder}"))).then_some(())
        },
    )
    .await;
    let waiting_lock = locks.get(&waiting_lock_name).await.unwrap();
    assert_eq!(phase(&waiting_lock), Some(LockPhase::Waiting));
    // The template itself holds nothing.
    let template = locks.get("batch").await.unwrap();
    assert_eq!(phase(&template), Some(LockPhase::Released));

    finish(&jobs, &running.name_any(), true).await;
    let next = wait_unsuspended(&jobs, waiting_name).await;
    assert!(
        fence_of(&next) > fence,
        "the second Job's fence {} must exceed the first's {fence}",
        fence_of(&next)
    );
    // The first Job's lock is gone (its finalizer released it) and so is the Job's
    // finalizer; its status says what happened.
    wait_lock_gone(&locks, &per_job_lock_name(&running), "the first Job's").await;
    let first = jobs.get(&running.name_any()).await.unwrap();
    assert!(!first.finalizers().iter().any(|f| f == FINALIZER));
    assert!(
        first.annotations()[STATUS_ANNOTATION].contains("deleted lock"),
        "{:?}",
        first.annotations()
    );

    // A third Job queues behind the second; deleted while it waits, its lock goes
    // with it (no garbage collector needed: the controller deletes it).
    let third = create_held(&jobs, "third", &[(TEMPLATE_ANNOTATION, "batch")]).await;
    let third_lock = per_job_lock_name(&third);
    eventually("the third Job's lock to wait", TIMEOUT, || async {
        let lock = locks.get(&third_lock).await.ok()?;
        (phase(&lock) == Some(LockPhase::Waiting)).then_some(())
    })
    .await;
    jobs.delete("third", &DeleteParams::background())
        .await
        .unwrap();
    eventually(
        "the deleted Job and its lock to be gone",
        TIMEOUT,
        || async {
            let job_gone = jobs.get_opt("third").await.unwrap().is_none();
            let lock_gone = locks.get_opt(&third_lock).await.unwrap().is_none();
            (job_gone && lock_gone).then_some(())
        },
    )
    .await;

    // A failed Job lets go too.
    finish(&jobs, waiting_name, false).await;
    wait_lock_gone(&locks, &waiting_lock_name, "the second Job's").await;
    watch.assert_none();
}

/// A lock template with `permits: 2` and six Jobs (docs/design.md §6.2): the Jobs' own
/// locks inherit the permits, two Jobs run at once, each finish lets one more start,
/// and all six complete with distinct fences. Every object version of the Jobs is
/// watched: never more than two running at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn template_with_two_permits_runs_two_jobs_at_a_time() {
    const PERMITS: usize = 2;
    const JOBS: usize = 6;
    let (_, _, locks, jobs) = setup("jobs-permits").await;
    let watch = OverlapWatch::at_most(
        PERMITS,
        vec![jobs.clone()],
        watcher::Config::default(),
        job_runs,
    );

    let mut template = lease_template("loaders", "warehouse");
    template.spec.permits = PERMITS as u32;
    create(&locks, &template).await;
    for i in 0..JOBS {
        create_held(
            &jobs,
            &format!("load-{i}"),
            &[(TEMPLATE_ANNOTATION, "loaders")],
        )
        .await;
    }
    let mut fences = BTreeMap::new();
    while fences.len() < JOBS {
        let want = (JOBS - fences.len()).min(PERMITS);
        let running = eventually(
            &format!("{want} Jobs to run at once ({} done)", fences.len()),
            TIMEOUT,
            || async {
                let all = jobs.list(&ListParams::default()).await.ok()?;
                let running: Vec<Job> = all.items.into_iter().filter(job_runs).collect();
                (running.len() == want).then_some(running)
            },
        )
        .await;
        // Finish one; the other keeps its permit while the next Job takes this one's.
        let name = running[0].name_any();
        let started = wait_unsuspended(&jobs, &name).await;
        let own_lock = locks.get(&per_job_lock_name(&started)).await.unwrap();
        assert_eq!(own_lock.spec.permits, PERMITS as u32, "inherited");
        assert_eq!(
            own_lock.status.as_ref().unwrap().fence,
            Some(fence_of(&started))
        );
        fences.insert(name.clone(), fence_of(&started));
        finish(&jobs, &name, true).await;
    }
    let distinct: std::collections::BTreeSet<_> = fences.values().collect();
    assert_eq!(distinct.len(), JOBS, "one fence per grant: {fences:?}");
    for i in 0..JOBS {
        let job = jobs.get(&format!("load-{i}")).await.unwrap();
        assert_eq!(
            lockwarden::controller::jobs::finished(&job),
            Some("Complete")
        );
    }
    watch.assert_none();
}

/// The first version of the Job that anyone sees with `suspend: false` already
/// carries the fence, holder and lock annotations on its pod template, equal to the
/// lock's status; the lock is claimed by the Job, and released (and unclaimed) when it
/// completes; a later Job on the same lock gets a fresh acquisition, a higher fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_is_on_the_pod_template_when_suspend_turns_false() {
    let (client, ns, locks, jobs) = setup("jobs-fence").await;

    // The watch starts before the Job exists, so it sees every version of it.
    let first_unsuspended = {
        let jobs = jobs.clone();
        tokio::spawn(async move {
            let mut stream = watcher(
                jobs,
                watcher::Config::default().fields("metadata.name=migrate"),
            )
            .applied_objects()
            .boxed();
            while let Some(event) = stream.next().await {
                if let Ok(job) = event
                    && !is_suspended(&job)
                {
                    return job;
                }
            }
            panic!("the watch ended");
        })
    };
    create(&locks, &lease_lock("migration", "migration-key")).await;
    create_held(&jobs, "migrate", &[(LOCK_ANNOTATION, "migration")]).await;
    let seen = tokio::time::timeout(TIMEOUT, first_unsuspended)
        .await
        .expect("the Job is unsuspended")
        .unwrap();
    let annotations = template_annotations(&seen);
    let lock = locks.get("migration").await.unwrap();
    let status = lock.status.clone().unwrap();
    assert!(acquired(&lock));
    assert_eq!(
        annotations.get(FENCE_ANNOTATION),
        Some(&status.fence.unwrap().to_string()),
        "{annotations:?}"
    );
    assert_eq!(annotations.get(HOLDER_ANNOTATION), status.holder.as_ref());
    assert_eq!(
        annotations.get(LOCK_ANNOTATION).map(String::as_str),
        Some("migration")
    );
    assert_eq!(
        lock.annotations().get(CLAIM_ANNOTATION),
        Some(&format!("migrate/{}", seen.uid().unwrap()))
    );
    wait_event(&client, &ns, "migrate", "Normal", "Started", "").await;
    let first_fence = status.fence.unwrap();
    // The Job controller's Pods carry it: what the workload reads.
    let pods = support::kube::wait_pods_with_fence(&client, &ns, "migrate", first_fence).await;
    for pod in &pods {
        let a = pod.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(a.get(HOLDER_ANNOTATION), status.holder.as_ref(), "{a:?}");
    }

    finish(&jobs, "migrate", true).await;
    let released = wait_phase(&locks, "migration", LockPhase::Released, TIMEOUT).await;
    assert!(released.spec.release);
    assert!(!released.annotations().contains_key(CLAIM_ANNOTATION));
    let note = wait_event(&client, &ns, "migrate", "Normal", "Released", "").await;
    assert!(note.contains(&format!("fence {first_fence}")), "{note}");

    create_held(&jobs, "migrate-again", &[(LOCK_ANNOTATION, "migration")]).await;
    let again = wait_unsuspended(&jobs, "migrate-again").await;
    assert!(fence_of(&again) > first_fence);
    let lock = locks.get("migration").await.unwrap();
    assert!(!lock.spec.release);
    assert_eq!(lock.status.unwrap().fence, Some(fence_of(&again)));
}

/// A queued template (docs/design.md §6.4): Jobs wait in the key's queue, and a Job
/// annotated `lockwarden.io/priority` that arrives later runs before an earlier one
/// without; the waiting Job's status says its place. Nothing runs while the key is
/// held by someone else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_template_jobs_run_by_priority_then_arrival() {
    let (client, ns, locks, jobs) = setup("jobs-priority").await;
    let watch = overlap_watch(jobs.clone());
    let mut template = lease_template("queued", "queued-key");
    template.spec.queue = true;
    create(&locks, &template).await;
    let queued = |holder: &str| AcquireRequest {
        queue: Some(Default::default()),
        ..AcquireRequest::new(holder, Duration::from_secs(30))
    };
    let (outsider, held) = hold_lease(&client, &ns, "queued-key", &queued("outsider")).await;
    let registered = |holder: String| {
        let outsider = &outsider;
        async move {
            let record = outsider.inspect().await.ok()??.record.ok()?;
            let queue = record.set?.queue?;
            queue
                .waiters
                .iter()
                .any(|w| w.holder == holder)
                .then_some(())
        }
    };
    for (name, annotations) in [
        ("early", vec![(TEMPLATE_ANNOTATION, "queued")]),
        (
            "urgent",
            vec![(TEMPLATE_ANNOTATION, "queued"), (PRIORITY_ANNOTATION, "10")],
        ),
    ] {
        let created = create_held(&jobs, name, &annotations).await;
        let holder = format!("{CLUSTER}/{ns}/job/{name}/{}", created.uid().unwrap());
        eventually(&format!("{name} to be registered"), TIMEOUT, || {
            registered(holder.clone())
        })
        .await;
        let own = per_job_lock_name(&created);
        let lock = locks.get(&own).await.unwrap();
        let expected = (name == "urgent").then_some(10);
        assert_eq!(lock.spec.priority, expected, "{name}'s lock priority");
    }
    outsider.release(&held).await.unwrap();
    wait_unsuspended(&jobs, "urgent").await;
    let early = eventually("early to wait first in line", TIMEOUT, || async {
        let job = jobs.get("early").await.ok()?;
        let status = job.annotations().get(STATUS_ANNOTATION)?.clone();
        (is_suspended(&job) && status.contains("queue position 0 of 1")).then_some(status)
    })
    .await;
    assert!(
        early.contains(&format!("held by {CLUSTER}/{ns}/job/urgent/")),
        "{early}"
    );
    finish(&jobs, "urgent", true).await;
    wait_unsuspended(&jobs, "early").await;
    finish(&jobs, "early", true).await;
    watch.assert_none();
}

/// Two Jobs naming one lock: one claims it and runs, the other stays suspended saying
/// which Job has the claim (and still does when the claim is removed by hand); it
/// starts only after the first fails, with a fresh acquisition (a higher fence).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_jobs_naming_one_lock_take_turns() {
    let (client, ns, locks, jobs) = setup("jobs-named").await;
    let watch = overlap_watch(jobs.clone());
    create(&locks, &lease_lock("shared", "shared-key")).await;
    for name in ["one", "two"] {
        create_held(&jobs, name, &[(LOCK_ANNOTATION, "shared")]).await;
    }
    let (running, waiting) = eventually("one Job running, the other waiting", TIMEOUT, || async {
        let (running, waiting) =
            one_running(jobs.get("one").await.ok()?, jobs.get("two").await.ok()?)?;
        let status = waiting.annotations().get(STATUS_ANNOTATION)?;
        status
            .contains(&format!("claimed by Job {}", running.name_any()))
            .then_some((running, waiting))
    })
    .await;
    // Even with the claim removed by hand, the waiting Job does not start next to the
    // running one.
    locks
        .patch(
            "shared",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"annotations": {CLAIM_ANNOTATION: null}}})),
        )
        .await
        .unwrap();
    let note = wait_event(
        &client,
        &ns,
        &waiting.name_any(),
        "Warning",
        "LockInUse",
        &format!("Job {} runs with it", running.name_any()),
    )
    .await;
    assert!(note.contains("claim was removed"), "{note}");
    assert!(is_suspended(&jobs.get(&waiting.name_any()).await.unwrap()));

    finish(&jobs, &running.name_any(), false).await;
    let next = wait_unsuspended(&jobs, &waiting.name_any()).await;
    assert!(fence_of(&next) > fence_of(&running));
    watch.assert_none();
}

/// The Lease is held by someone outside (the engine, as another cluster or a CLI
/// would): the Job stays suspended, its status and an Event naming that holder; when
/// the outsider lets go, the Job starts; when the lock is then taken over by force,
/// the running Job is suspended (its Pods deleted), waits for its named lock again —
/// re-acquired although `Lost` is final for the lock's generation — and restarts with
/// a fence above the forcer's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_whose_lock_is_held_elsewhere_stays_suspended() {
    let (client, ns, locks, jobs) = setup("jobs-elsewhere").await;
    let (_, outsider, lease) = workloads::held_back_by_an_outsider::<Job>(&client, &ns).await;
    let started = workloads::started_once_the_outsider_lets_go(&jobs, &outsider, &lease).await;

    // Taken over by force while the Job runs: by default (`on-lock-lost: suspend`) the
    // Job is suspended, a Warning names the reason and the fence it ran with, and the
    // real Job controller deletes its Pods.
    let old = fence_of(&started);
    let forced = force(&locks, "contested").await;
    let note = wait_event(&client, &ns, "blocked", "Warning", "Suspended", "").await;
    assert!(
        note.contains(&format!("ran with fence {old}")) && note.contains("Lost"),
        "{note}"
    );
    eventually("the Job suspended and its Pods gone", TIMEOUT, || async {
        let job = jobs.get("blocked").await.ok()?;
        let pods = support::kube::job_pods(&client, &ns, "blocked").await;
        (is_suspended(&job)
            && job.annotations().get(LOST_FENCE_ANNOTATION) == Some(&old.to_string())
            && pods.iter().all(|p| p.metadata.deletion_timestamp.is_some()))
        .then_some(())
    })
    .await;
    let forced_fence = forced.status.as_ref().unwrap().fence.unwrap();
    assert!(forced_fence > old);

    // The named lock, Lost (final for its generation), was let go and is claimed
    // anew: a new acquisition, which waits for the forcer.
    eventually("the Job to wait for the forcer", TIMEOUT, || async {
        let job = jobs.get("blocked").await.ok()?;
        let status = job.annotations().get(STATUS_ANNOTATION)?;
        (is_suspended(&job) && status.contains(&format!("held by {CLUSTER}/{ns}/forcer")))
            .then_some(())
    })
    .await;
    // When the forcer lets go, the Job starts again, with a fence above both.
    delete(&locks, "forcer").await;
    let again = wait_unsuspended(&jobs, "blocked").await;
    assert!(
        fence_of(&again) > forced_fence,
        "restarted with fence {}, the forcer had {forced_fence}",
        fence_of(&again)
    );
    assert!(!again.annotations().contains_key(LOST_FENCE_ANNOTATION));
    wait_event(
        &client,
        &ns,
        "blocked",
        "Normal",
        "Started",
        &format!("fence {}", fence_of(&again)),
    )
    .await;
}

/// A DistributedLock name of exactly 253 characters (the Kubernetes limit), and one over.
const NAME_AT_LIMIT: &str = concat!(
    "a123456789b123456789c123456789d123456789e123456789f123456789g123456789h123456789",
    "i123456789j123456789k123456789l123456789m123456789n123456789o123456789p123456789",
    "q123456789r123456789s123456789t123456789u123456789v123456789w123456789x123456789",
    "y123456789z12",
);
const NAME_OVER_LIMIT: &str = concat!(
    "a123456789b123456789c123456789d123456789e123456789f123456789g123456789h123456789",
    "i123456789j123456789k123456789l123456789m123456789n123456789o123456789p123456789",
    "q123456789r123456789s123456789t123456789u123456789v123456789w123456789x123456789",
    "y123456789z123",
);

/// One Job per kind of bad input (locks `good` and `held-template` exist): (Job,
/// annotations, created suspended, Event reason, words in the Event). The name limits
/// are lock::names's, shared with the CRD and the CLI: 253 characters is a name (so the
/// lock is merely missing), 254 is not; nor is an empty label or a control character.
#[rustfmt::skip]
const BAD_ROWS: &[BadRow] = &[
    ("no-template", &[(TEMPLATE_ANNOTATION, "missing")], true, "TemplateNotFound", "lock template missing"),
    ("both", &[(LOCK_ANNOTATION, "good"), (TEMPLATE_ANNOTATION, "good")], true, "InvalidLockAnnotation", "both lockwarden.io/lock and lockwarden.io/lock-template"),
    ("single-and-list", &[(LOCK_ANNOTATION, "good"), (LOCKS_ANNOTATION, "good,other")], true, "InvalidLockAnnotation", "both lockwarden.io/lock and lockwarden.io/locks"),
    ("empty-entry", &[(LOCKS_ANNOTATION, "good,,other")], true, "InvalidLockAnnotation", "has an empty entry"),
    ("missing-of-several", &[(LOCKS_ANNOTATION, "good,absent")], true, "LockNotFound", "DistributedLock absent does not exist"),
    ("elsewhere", &[(LOCK_ANNOTATION, "other-ns/good")], true, "InvalidLockAnnotation", "another namespace"),
    ("bad-name", &[(LOCK_ANNOTATION, "Not_A_Name")], true, "InvalidLockAnnotation", "invalid DistributedLock name"),
    ("name-at-limit", &[(LOCK_ANNOTATION, NAME_AT_LIMIT)], true, "LockNotFound", "does not exist"),
    ("name-over-limit", &[(LOCK_ANNOTATION, NAME_OVER_LIMIT)], true, "InvalidLockAnnotation", "a DNS-1123 subdomain: at most 253"),
    ("empty-label", &[(LOCK_ANNOTATION, "a..b")], true, "InvalidLockAnnotation", "invalid DistributedLock name \"a..b\""),
    ("control-character", &[(LOCK_ANNOTATION, "a\u{1}b")], true, "InvalidLockAnnotation", "invalid DistributedLock name"),
    ("no-lock", &[(LOCK_ANNOTATION, "absent")], true, "LockNotFound", "DistributedLock absent does not exist"),
    ("held-template", &[(TEMPLATE_ANNOTATION, "held-template")], true, "TemplateNotReleased", "spec.release: false"),
    ("not-suspended", &[(LOCK_ANNOTATION, "good")], false, "NotSuspended", "spec.suspend: true"),
    ("bad-policy", &[(LOCK_ANNOTATION, "good"), (ON_LOCK_LOST_ANNOTATION, "pause")], true, "InvalidLockAnnotation", "lockwarden.io/on-lock-lost: \"pause\" is not one of suspend, fail, ignore"),
    ("long-grace", &[(LOCK_ANNOTATION, "good"), (LOST_GRACE_ANNOTATION, "10s")], true, "InvalidLockAnnotation", "past the point where another holder may acquire the lock"),
];

/// Bad input, one row each: a Warning Event saying what is wrong, the Job left as it
/// was (suspended, no fence), and the controller still serving a good Job afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gives_a_warning_and_leaves_the_job_suspended() {
    let (client, ns, locks, jobs) = setup("jobs-bad").await;
    create(&locks, &lease_lock("held-template", "t-key")).await;
    create(&locks, &lease_lock("good", "good-key")).await;
    let seen = workloads::bad_input_is_called_out::<Job>(&client, &ns, BAD_ROWS).await;
    for (job, note) in &seen {
        let name = job.name_any();
        assert_eq!(
            job.annotations().get(STATUS_ANNOTATION),
            Some(note),
            "{name}"
        );
    }
    // Nothing claimed the good lock for the bad Jobs, and no per-Job lock was made.
    let good = locks.get("good").await.unwrap();
    assert!(!good.annotations().contains_key(CLAIM_ANNOTATION));
    let all = locks.list(&ListParams::default()).await.unwrap();
    assert_eq!(
        all.items.len(),
        2,
        "{:?}",
        all.items.iter().map(|l| l.name_any()).collect::<Vec<_>>()
    );

    // Still serving: a good Job on the good lock starts.
    create_held(&jobs, "fine", &[(LOCK_ANNOTATION, "good")]).await;
    wait_unsuspended(&jobs, "fine").await;

    // Creating the missing template later lets its Job go ahead.
    create(&locks, &lease_template("missing", "m-key")).await;
    wait_unsuspended(&jobs, "no-template").await;

    // Deleting a running Job lets go of its claim: the lock is free for others.
    // Background propagation, as kubectl does (the API default for Jobs is to orphan
    // their Pods).
    jobs.delete("fine", &DeleteParams::background())
        .await
        .unwrap();
    eventually("the deleted Job to let go of its lock", TIMEOUT, || async {
        let gone = jobs.get_opt("fine").await.unwrap().is_none();
        let lock = locks.get("good").await.ok()?;
        (gone && !lock.annotations().contains_key(CLAIM_ANNOTATION) && lock.spec.release)
            .then_some(())
    })
    .await;
}

/// The RBAC rules the controller (DistributedLock controller, Job and Pod gating, with the
/// Kubernetes-Lease backend) needs in a namespace it serves — the list in
/// docs/architecture.md, which the Helm chart grants.
fn controller_rules() -> serde_json::Value {
    workloads::controller_rules(json!([
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": ["batch"], "resources": ["jobs/status"], "verbs": ["patch"]},
        {"apiGroups": ["batch"], "resources": ["jobs/finalizers"], "verbs": ["update"]},
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["list"]},
        {"apiGroups": [""], "resources": ["pods"],
         "verbs": ["get", "list", "watch", "patch", "delete"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]},
    ]))
}

/// The controller running as an identity with only [`controller_rules`] gates Jobs
/// end to end: a named lock (claim, start, release) and a template queue (create,
/// start, stop on loss, restart, delete), with its Events recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_gating_works_with_the_documented_rbac() {
    let (admin, ns) =
        support::kube::namespace_with_controller_as(controller_rules(), "jobs-rbac", CLUSTER).await;
    let locks: Api<DistributedLock> = Api::namespaced(admin.clone(), &ns);
    let jobs: Api<Job> = Api::namespaced(admin.clone(), &ns);
    let named = lease_lock("named", "named-key");
    let [named, queued] =
        workloads::named_and_queued::<Job>(&admin, &ns, &named, ["named-job", "queued-job"]).await;
    wait_event(&admin, &ns, "named-job", "Normal", "Started", "").await;
    // The queued Job's key is taken by force: it is suspended, its own lock made anew,
    // and it restarts with a higher fence once the forcer lets go. (With
    // LOCKWARDEN_KUBE_FEATURE_GATES=MutableSchedulingDirectivesForSuspendedJobs=false,
    // as before Kubernetes 1.36, the restart needs jobs/status to clear startTime.)
    let forced = force(&locks, "queue-key").await;
    wait_event(&admin, &ns, "queued-job", "Warning", "Suspended", "").await;
    delete(&locks, "forcer").await;
    let restarted = eventually("the queued Job to restart", TIMEOUT, || async {
        let job = jobs.get("queued-job").await.ok()?;
        (!is_suspended(&job) && fence_of(&job) > forced.status.as_ref()?.fence?).then_some(job)
    })
    .await;
    support::kube::wait_pods_with_fence(&admin, &ns, "queued-job", fence_of(&restarted)).await;
    finish(&jobs, "named-job", true).await;
    finish(&jobs, "queued-job", true).await;
    eventually("both locks let go", TIMEOUT, || async {
        let named_lock = locks.get("named").await.ok()?;
        let queued_gone = locks
            .get_opt(&per_job_lock_name(&queued))
            .await
            .ok()?
            .is_none();
        (phase(&named_lock) == Some(LockPhase::Released) && queued_gone).then_some(())
    })
    .await;
    wait_event(&admin, &ns, "named-job", "Normal", "Released", "").await;
    for job in [named, queued] {
        let job = jobs.get(&job.name_any()).await.unwrap();
        assert!(!job.finalizers().iter().any(|f| f == FINALIZER));
    }
}

// ---------------------------------------------------------------------------
// examples/

/// `kubectl` with the admin kubeconfig (or another), its output, and whether it worked.
async fn kubectl(kubeconfig: &Path, args: &[&str], stdin: Option<String>) -> (bool, String) {
    let plane = ControlPlane::shared();
    let out = support::kubectl::kubectl_as(plane, kubeconfig, args, stdin.as_deref()).await;
    (out.status.success(), support::kubectl::text(&out))
}

/// `kubectl apply -n ns -f examples/<file>` with the local endpoints filled in, as
/// scripts/demo does.
async fn apply_example(ns: &str, file: &str, aws: &str, zk: &str) {
    let path = support::repo_root().join("examples").join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("${AWS_ENDPOINT_URL}", aws)
        .replace("${ZK_SERVER}", zk);
    let admin = ControlPlane::shared().kubeconfig_path().to_path_buf();
    let (ok, out) = kubectl(&admin, &["apply", "-n", ns, "-f", "-"], Some(text)).await;
    assert!(ok, "kubectl apply -f examples/{file} failed:\n{out}");
}

async fn wait_acquired(locks: &Api<DistributedLock>, name: &str) -> DistributedLock {
    support::locks::wait_acquired(locks, name, TIMEOUT).await
}

/// Every manifest in `examples/` is applied with kubectl, in one namespace, and
/// reaches the state its opening comment promises. A new example without a check
/// here fails this test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_example_reaches_the_state_its_comment_promises() {
    let (client, ns, locks, jobs) = setup("jobs-examples").await;
    // Both servers start at once (each is shared by the binary's tests).
    let (moto, zk) = tokio::join!(
        tokio::task::spawn_blocking(support::moto::Moto::shared),
        tokio::task::spawn_blocking(support::zookeeper::ZooKeeper::shared),
    );
    let (moto, zk) = (moto.unwrap(), zk.unwrap());
    // The bucket s3-lock.yaml names (scripts/demo creates it the same way); the
    // DynamoDB example creates its table itself.
    moto.s3_client()
        .await
        .create_bucket()
        .bucket("lockwarden-demo")
        .send()
        .await
        .expect("create the demo bucket");
    let (aws, zk) = (moto.endpoint(), zk.connect_string());

    let mut files: Vec<String> = std::fs::read_dir(support::repo_root().join("examples"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|f| f.ends_with(".yaml"))
        // Kueue's examples need Kueue: tests/kueue applies and checks them; the
        // Terraform ones need tofu: tests/terraform.rs does.
        .filter(|f| !f.starts_with("kueue-") && !f.starts_with("terraform-"))
        .collect();
    // The S3 example carries the Secret the DynamoDB one uses; the contender waits
    // for the holder in lease-lock.yaml.
    files.sort_by_key(|f| {
        (
            f != "s3-lock.yaml",
            f == "lease-lock-contender.yaml",
            f.clone(),
        )
    });
    assert!(files.len() >= 10, "{files:?}");
    for file in &files {
        for line in std::fs::read_to_string(support::repo_root().join("examples").join(file))
            .unwrap()
            .lines()
            .take(1)
        {
            assert!(
                line.starts_with("# "),
                "examples/{file} starts with a comment"
            );
        }
        apply_example(&ns, file, &aws, &zk).await;
        match file.as_str() {
            "lease-lock.yaml" => {
                wait_acquired(&locks, "db-migration").await;
            }
            "lease-lock-contender.yaml" => {
                let holder = wait_acquired(&locks, "db-migration").await;
                eventually(
                    "db-migration-next Waiting, naming the holder",
                    TIMEOUT,
                    || async {
                        let lock = locks.get("db-migration-next").await.ok()?;
                        let message = lock.acquired_condition()?.message.clone();
                        (phase(&lock) == Some(LockPhase::Waiting)
                            && message.contains(holder.status.as_ref()?.holder.as_deref()?))
                        .then_some(())
                    },
                )
                .await;
                delete(&locks, "db-migration").await;
                let next = wait_acquired(&locks, "db-migration-next").await;
                assert!(next.status.unwrap().fence > holder.status.unwrap().fence);
            }
            "s3-lock.yaml" => {
                let lock = wait_acquired(&locks, "nightly-report").await;
                assert_eq!(lock.status.unwrap().backend.as_deref(), Some("s3"));
            }
            "dynamodb-lock.yaml" => {
                let lock = wait_acquired(&locks, "ledger-compaction").await;
                assert_eq!(lock.status.unwrap().backend.as_deref(), Some("dynamodb"));
            }
            "zookeeper-lock.yaml" => {
                let lock = wait_acquired(&locks, "partition-rebalance").await;
                assert_eq!(lock.status.unwrap().backend.as_deref(), Some("zookeeper"));
            }
            "job-gated.yaml" => {
                let (job, lock) =
                    started_with_the_fence_of(&jobs, &locks, "migrate-schema", "schema-migration")
                        .await;
                assert_eq!(
                    lock.annotations().get(CLAIM_ANNOTATION),
                    Some(&format!("migrate-schema/{}", job.uid().unwrap()))
                );
            }
            "guarded-job.yaml" => {
                started_with_the_fence_of(&jobs, &locks, "guarded-report", "guarded-report").await;
            }
            "job-queue.yaml" => check_job_queue_example(&jobs, &locks).await,
            "semaphore.yaml" => check_semaphore_example(&jobs, &locks).await,
            "shared-exclusive.yaml" => check_shared_exclusive_example(&locks).await,
            "job-kubectl-wait.yaml" => check_kubectl_wait_example(&client, &ns, &locks).await,
            "pod-gated.yaml" => check_pod_gated_example(&client, &ns, &locks).await,
            "cronjob-once.yaml" => check_cronjob_once_example(&client, &ns, &jobs).await,
            "job-two-locks.yaml" => {
                let job = wait_unsuspended_with_fences(&jobs, "load-warehouse").await;
                let mut expected = Vec::new();
                // Taken in key order: export-prefix's Lease key sorts first.
                for name in ["export-prefix", "warehouse-table"] {
                    let lock = wait_acquired(&locks, name).await;
                    assert_eq!(
                        lock.annotations().get(CLAIM_ANNOTATION),
                        Some(&format!("load-warehouse/{}", job.uid().unwrap()))
                    );
                    expected.push(format!("{name}={}", lock.status.unwrap().fence.unwrap()));
                }
                assert_eq!(
                    template_annotations(&job).get(FENCES_ANNOTATION),
                    Some(&expected.join(","))
                );
            }
            other => panic!("examples/{other} has no check in tests/jobs.rs; add one"),
        }
    }
}

/// examples/cronjob-once.yaml: the CronJob's first Job is started with a fence, and
/// once it completes the Lease remembers its run, by that fence. The CronJob is then
/// deleted, so it creates no more Jobs in the examples' namespace.
async fn check_cronjob_once_example(client: &Client, ns: &str, jobs: &Api<Job>) {
    use k8s_openapi::api::batch::v1::CronJob;
    use k8s_openapi::api::coordination::v1::Lease;
    // The first scheduled minute may be almost a minute away.
    let patience = TIMEOUT + Duration::from_secs(90);
    let job = eventually("the CronJob's first Job started", patience, || async {
        let list = jobs.list(&ListParams::default()).await.ok()?;
        list.items.into_iter().find(|j| {
            j.name_any().starts_with("nightly-export-") && !is_suspended(j) && j.fence().is_some()
        })
    })
    .await;
    let fence = job.fence().unwrap();
    support::kube::finish_pods(client, ns, &job.name_any(), true).await;
    let leases = Api::<Lease>::namespaced(client.clone(), ns);
    let runs = eventually("the Lease to remember the run", TIMEOUT, || async {
        let lease = leases.get("nightly-export").await.ok()?;
        let runs = lease.annotations().get("lockwarden.io/runs")?.clone();
        runs.contains(&format!("{ns}/nightly-export@"))
            .then_some(runs)
    })
    .await;
    let runs: serde_json::Value = serde_json::from_str(&runs).unwrap();
    assert_eq!(runs["runs"][0]["fence"], fence, "{runs}");
    Api::<CronJob>::namespaced(client.clone(), ns)
        .delete("nightly-export", &DeleteParams::default())
        .await
        .expect("delete the CronJob");
}

/// Job `job` unsuspended, lock `lock` Acquired, and the Job's pod template carrying that
/// lock's fence; returns both.
async fn started_with_the_fence_of(
    jobs: &Api<Job>,
    locks: &Api<DistributedLock>,
    job: &str,
    lock: &str,
) -> (Job, DistributedLock) {
    let job = wait_unsuspended(jobs, job).await;
    let lock = wait_acquired(locks, lock).await;
    assert_eq!(
        job.fence(),
        Some(lock.status.as_ref().unwrap().fence.unwrap()),
        "{}'s fence",
        job.name_any()
    );
    (job, lock)
}

/// A Job with several locks once unsuspended: its pod template carries
/// `lockwarden.io/fences` (and its Pods exist, made by the real Job controller).
async fn wait_unsuspended_with_fences(jobs: &Api<Job>, name: &str) -> Job {
    eventually(
        &format!("Job {name} to be unsuspended with fences"),
        TIMEOUT,
        || async {
            jobs.get(name).await.ok().filter(|j| {
                !is_suspended(j) && template_annotations(j).contains_key(FENCES_ANNOTATION)
            })
        },
    )
    .await
}

async fn check_job_queue_example(jobs: &Api<Job>, locks: &Api<DistributedLock>) {
    let (running, waiting) = eventually("one queued Job running, one waiting", TIMEOUT, || async {
        let a = jobs.get("nightly-batch-a").await.ok()?;
        let b = jobs.get("nightly-batch-b").await.ok()?;
        let (running, waiting) = one_running(a, b)?;
        let holder = template_annotations(&running)
            .get(HOLDER_ANNOTATION)?
            .clone();
        let status = waiting.annotations().get(STATUS_ANNOTATION)?;
        let lock = locks.get(&per_job_lock_name(&waiting)).await.ok()?;
        (status.contains(&format!("held by {holder}")) && phase(&lock) == Some(LockPhase::Waiting))
            .then_some((running, waiting))
    })
    .await;
    assert!(acquired(
        &locks.get(&per_job_lock_name(&running)).await.unwrap()
    ));
    let template = locks.get("nightly-batch").await.unwrap();
    assert_eq!(phase(&template), Some(LockPhase::Released));
    let listed = locks
        .list(&ListParams::default().labels("lockwarden.io/template=nightly-batch"))
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 2);
    // "When the first Job completes ... the second Job starts with a higher fence."
    finish(jobs, &running.name_any(), true).await;
    let next = wait_unsuspended(jobs, &waiting.name_any()).await;
    assert!(fence_of(&next) > fence_of(&running));
}

/// Two of the three Jobs running, each with its own permit and fence; the third
/// waiting, saying no permit is free; it starts once a running one finishes.
async fn check_semaphore_example(jobs: &Api<Job>, locks: &Api<DistributedLock>) {
    let names = ["warehouse-load-a", "warehouse-load-b", "warehouse-load-c"];
    let (running, waiting) = eventually("two loads running, one waiting", TIMEOUT, || async {
        let (running, waiting) =
            workloads::free_and_held(jobs, &names, |j| !is_suspended(j)).await?;
        let [waiting] = <[Job; 1]>::try_from(waiting).ok()?;
        let status = waiting.annotations().get(STATUS_ANNOTATION)?;
        let lock = locks.get(&per_job_lock_name(&waiting)).await.ok()?;
        let full = lock.status.as_ref()?.permits_in_use == Some(2);
        (status.contains("no permit free: 2 of 2 in use by 2 holders")
            && phase(&lock) == Some(LockPhase::Waiting)
            && full)
            .then_some((running, waiting))
    })
    .await;
    let fences: Vec<i64> = running.iter().map(fence_of).collect();
    assert_ne!(fences[0], fences[1], "one fence per permit");
    let template = locks.get("warehouse-loads").await.unwrap();
    assert_eq!(phase(&template), Some(LockPhase::Released));
    finish(jobs, &running[0].name_any(), true).await;
    let next = wait_unsuspended(jobs, &waiting.name_any()).await;
    assert!(fence_of(&next) > *fences.iter().max().unwrap());
}

/// One side holds (the writer alone, or readers), the other waits, never a reader
/// with the writer; deleting the holders lets the other side acquire with higher
/// fences.
async fn check_shared_exclusive_example(locks: &Api<DistributedLock>) {
    let names = ["dataset-reader-1", "dataset-reader-2", "dataset-writer"];
    let holding = eventually("one side holding, the other waiting", TIMEOUT, || async {
        let mut holding = Vec::new();
        let mut waiting = 0;
        for name in names {
            let lock = locks.get(name).await.ok()?;
            if acquired(&lock) {
                holding.push((name, lock.status?.fence?));
            } else if phase(&lock) == Some(LockPhase::Waiting) {
                waiting += 1;
            }
        }
        let writer = holding.iter().any(|(n, _)| *n == "dataset-writer");
        assert!(
            !(writer && holding.len() > 1),
            "the writer holds together with a reader: {holding:?}"
        );
        (!holding.is_empty() && holding.len() + waiting == names.len()).then_some(holding)
    })
    .await;
    let latest = holding.iter().map(|(_, f)| *f).max().unwrap();
    for (name, _) in &holding {
        delete(locks, name).await;
    }
    // The waiters acquire in turn. A reader that came after the writer was first in line
    // waits behind it, so once the writer holds (alone) it is deleted too, and that
    // reader's turn follows.
    let mut remaining: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| holding.iter().all(|(h, _)| h != n))
        .collect();
    while !remaining.is_empty() {
        let (name, fence) = eventually("the next waiter to acquire", TIMEOUT, || {
            let remaining = remaining.clone();
            async move {
                for name in remaining {
                    let lock = locks.get(name).await.ok()?;
                    if acquired(&lock) {
                        return Some((name, lock.status?.fence?));
                    }
                }
                None
            }
        })
        .await;
        assert!(fence > latest, "{name}: fence {fence} after {latest}");
        remaining.retain(|n| *n != name);
        if name == "dataset-writer" && !remaining.is_empty() {
            delete(locks, name).await;
        }
    }
}

/// One Pod of the Deployment ungated with its own lock's fence, and readable from the
/// downward-API volume the container mounts; the other two gated, waiting for that
/// Pod's holder; the template Released.
async fn check_pod_gated_example(client: &Client, ns: &str, locks: &Api<DistributedLock>) {
    use k8s_openapi::api::core::v1::Pod;
    use lockwarden::controller::pods::has_gate;
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    let (active, waiting) = eventually(
        "one singleton Pod ungated, two waiting for its holder",
        TIMEOUT,
        || async {
            let (free, gated) =
                workloads::listed_free_and_held(&pods, "app=singleton", |p| !has_gate(p)).await?;
            let [active] = <[Pod; 1]>::try_from(free).ok()?;
            let holder = active.annotations().get(HOLDER_ANNOTATION)?.clone();
            let all_wait = gated.iter().all(|p| {
                p.annotations()
                    .get(STATUS_ANNOTATION)
                    .is_some_and(|s| s.contains(&format!("held by {holder}")))
            });
            (gated.len() == 2 && all_wait).then_some((active, gated))
        },
    )
    .await;
    let uid = active.uid().unwrap();
    let own = locks
        .get(&format!("{}-{}", active.name_any(), &uid[..8]))
        .await
        .unwrap();
    assert!(acquired(&own));
    assert_eq!(
        active.annotations().get(FENCE_ANNOTATION),
        Some(&own.status.as_ref().unwrap().fence.unwrap().to_string())
    );
    assert_eq!(own.owner_references()[0].uid, uid);
    // The container reads the fence from the downward-API volume at this path.
    let spec = active.spec.as_ref().unwrap();
    let volume = spec.volumes.as_ref().unwrap()[0]
        .downward_api
        .as_ref()
        .unwrap();
    let item = &volume.items.as_ref().unwrap()[0];
    assert_eq!(
        item.field_ref.as_ref().unwrap().field_path,
        "metadata.annotations['lockwarden.io/fence']"
    );
    let mount = &spec.containers[0].volume_mounts.as_ref().unwrap()[0];
    assert!(
        spec.containers[0].command.as_ref().unwrap()[2]
            .contains(&format!("{}/{}", mount.mount_path, item.path))
    );
    assert_eq!(waiting.len(), 2);
    let template = locks.get("singleton").await.unwrap();
    assert_eq!(phase(&template), Some(LockPhase::Released));
}

/// The lock is Acquired, and the example's ServiceAccount, with exactly the RBAC the
/// example grants, can run the init container's `kubectl wait` (and read the fence);
/// without the RoleBinding it is forbidden.
async fn check_kubectl_wait_example(client: &Client, ns: &str, locks: &Api<DistributedLock>) {
    let lock = wait_acquired(locks, "report-export").await;
    let plane = ControlPlane::shared();
    let as_sa = plane.user_kubeconfig(&format!("system:serviceaccount:{ns}:lock-waiter"), None);
    // The init container's command, as the Job spells it.
    let job = Api::<Job>::namespaced(client.clone(), ns)
        .get("report-export")
        .await
        .unwrap();
    let init = &job
        .spec
        .unwrap()
        .template
        .spec
        .unwrap()
        .init_containers
        .unwrap()[0];
    let mut args: Vec<String> = init.args.clone().unwrap();
    args.retain(|a| !a.starts_with("--timeout"));
    args.push("--timeout=60s".into());
    args.extend(["-n".into(), ns.into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, out) = kubectl(&as_sa, &args, None).await;
    assert!(
        ok && out.contains("condition met"),
        "kubectl {args:?} as the ServiceAccount:\n{out}"
    );
    let (ok, out) = kubectl(
        &as_sa,
        &[
            "get",
            "dlock",
            "report-export",
            "-n",
            ns,
            "-o",
            "jsonpath={.status.fence}",
        ],
        None,
    )
    .await;
    assert!(ok, "{out}");
    assert_eq!(out.trim(), lock.status.unwrap().fence.unwrap().to_string());

    // Without the RoleBinding the same command is forbidden.
    Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(client.clone(), ns)
        .delete("lock-waiter", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "kubectl wait to be forbidden without the RoleBinding",
        TIMEOUT,
        || async {
            let (ok, out) = kubectl(&as_sa, &args, None).await;
            (!ok && out.contains("forbidden")).then_some(())
        },
    )
    .await;
}
