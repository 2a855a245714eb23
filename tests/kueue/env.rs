//! The Kueue environment's own proof: its webhooks are live on the real API server and
//! a queued Job goes through admission and runs on the node.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kueues_job_webhook_suspends_a_job_with_a_queue_name() {
    let (node, client, ns) = setup("kueue-webhook").await;
    // A LocalQueue whose ClusterQueue does not exist: the Job is Kueue's, never admitted.
    let queue = unique("lq");
    create(
        &client,
        "LocalQueue",
        "localqueues",
        Some(&ns),
        json!({
            "metadata": { "name": queue },
            "spec": { "clusterQueue": unique("no-such-cq") },
        }),
    )
    .await;
    let jobs = Api::<Job>::namespaced(client.clone(), &ns);
    let job = queued_job(node, "queued", &queue, "true");
    let stored = jobs
        .create(&PostParams::default(), &job)
        .await
        .expect("create the queued Job");
    assert_eq!(
        stored.spec.as_ref().and_then(|s| s.suspend),
        Some(true),
        "Kueue's Job webhook did not suspend the Job created with suspend: false"
    );
    // Still suspended as stored (not only in the create's answer).
    let read = jobs.get("queued").await.expect("read the Job");
    assert_eq!(read.spec.as_ref().and_then(|s| s.suspend), Some(true));

    let workload = eventually("a Workload owned by the Job", TIMEOUT, || async {
        workloads_of(&client, &ns, &stored).await.into_iter().next()
    })
    .await;
    assert_eq!(
        workload.data["spec"]["queueName"], queue,
        "the Workload's queueName: {:?}",
        workload.data["spec"]
    );
    assert!(
        !condition(&workload, "Admitted"),
        "a Workload of a LocalQueue without a ClusterQueue was admitted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kueue_managed_job_is_admitted_and_runs_to_completion_on_the_node() {
    let (node, client, ns) = setup("kueue-run").await;
    let (cluster_queue, queue) = Queues {
        namespace_only: false,
        checks: &[],
        cpu: "1",
        memory: "1Gi",
        preemption: None,
    }
    .create(&client, &ns)
    .await;

    let jobs = Api::<Job>::namespaced(client.clone(), &ns);
    let job = jobs
        .create(
            &PostParams::default(),
            &queued_job(node, "work", &queue, "echo admitted-and-ran"),
        )
        .await
        .expect("create the queued Job");
    assert_eq!(job.spec.as_ref().and_then(|s| s.suspend), Some(true));

    let workload = eventually("the Job's Workload to be Admitted", TIMEOUT, || async {
        workloads_of(&client, &ns, &job)
            .await
            .into_iter()
            .find(|w| condition(w, "Admitted"))
    })
    .await;
    assert_eq!(
        workload.data["status"]["admission"]["clusterQueue"], cluster_queue,
        "admitted by another ClusterQueue: {:?}",
        workload.data["status"]
    );

    eventually("the Job to complete on the node", TIMEOUT, || async {
        let job = jobs.get("work").await.ok()?;
        let status = job.status?;
        if let Some(failed) = status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "Failed" && c.status == "True")
        {
            panic!(
                "the Job failed: {failed:?}; kubelet log:\n{}",
                node.kubelet_log_tail(40)
            );
        }
        status
            .conditions?
            .iter()
            .any(|c| c.type_ == "Complete" && c.status == "True")
            .then_some(())
    })
    .await;
    let finished = eventually("the Workload to be Finished", TIMEOUT, || async {
        workloads_of(&client, &ns, &job)
            .await
            .into_iter()
            .find(|w| condition(w, "Finished"))
    })
    .await;
    assert!(
        condition(&finished, "Admitted"),
        "the finished Workload lost its Admitted condition: {:?}",
        finished.data["status"]["conditions"]
    );
}
