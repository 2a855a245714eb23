//! Every `examples/kueue-*.yaml` (they need Kueue, so tests/jobs.rs leaves them to this
//! binary) applied with kubectl in one namespace, with the node's local image, and
//! driven to the state its opening comment promises. A new Kueue example without a
//! check here fails this test.

use std::collections::BTreeSet;

use super::admission::{install_crds, pod_fences, start_controller, wait_complete, watch_running};
use super::*;
use crate::support::kubectl::kubectl_on;
use crate::support::repo_root;

/// `kubectl apply -n ns -f examples/<file>` with the node's workload image (no
/// registry is reachable).
async fn apply_example(node: &Node, ns: &str, file: &str) {
    let text = std::fs::read_to_string(repo_root().join("examples").join(file))
        .unwrap()
        .replace("busybox:1.36", &node.images().workload)
        .replace("imagePullPolicy: IfNotPresent", "imagePullPolicy: Never");
    let out = kubectl_on(node.plane(), &["apply", "-n", ns, "-f", "-"], Some(&text)).await;
    assert!(
        out.status.success(),
        "kubectl apply -f examples/{file} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Our check's state and message in the Workload of Job `job`.
async fn check_of(client: &Client, ns: &str, job: &Job, check: &str) -> Option<(String, String)> {
    let workload = workloads_of(client, ns, job).await.into_iter().next()?;
    let entry = workload.data["status"]["admissionChecks"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == check)?
        .clone();
    Some((
        entry["state"].as_str()?.to_string(),
        entry["message"].as_str()?.to_string(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kueue_example_reaches_the_state_its_comment_promises() {
    let (node, client, ns) = setup("kueue-examples").await;
    install_crds(&client).await;
    let controller = start_controller(node, &ns).await;
    let files: BTreeSet<String> = std::fs::read_dir(repo_root().join("examples"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|f| f.starts_with("kueue-") && f.ends_with(".yaml"))
        .collect();
    assert!(!files.is_empty(), "no examples/kueue-*.yaml");
    let jobs = Api::<Job>::namespaced(client.clone(), &ns);
    for file in &files {
        let (seen, watch) = watch_running(&client, &ns);
        apply_example(node, &ns, file).await;
        match file.as_str() {
            "kueue-semaphore.yaml" => {
                let checks = Api::<DynamicObject>::all_with(
                    client.clone(),
                    &resource("AdmissionCheck", "admissionchecks"),
                );
                eventually(
                    "AdmissionCheck report-slots Active=True",
                    TIMEOUT,
                    || async {
                        let check = checks.get("report-slots").await.ok()?;
                        check.data["status"]["conditions"]
                            .as_array()?
                            .iter()
                            .any(|c| c["type"] == "Active" && c["status"] == "True")
                            .then_some(())
                    },
                )
                .await;
                let names = ["report-a", "report-b", "report-c"];
                // The third waits, its check Pending naming the full semaphore.
                let waiting = eventually(
                    "a report's check Pending with 2 of 2 in use",
                    TIMEOUT,
                    || async {
                        for name in names {
                            let job = jobs.get(name).await.ok()?;
                            if let Some((state, message)) =
                                check_of(&client, &ns, &job, "report-slots").await
                                && state == "Pending"
                                && message.contains("no permit free: 2 of 2 in use")
                            {
                                return Some(message);
                            }
                        }
                        None
                    },
                )
                .await;
                eprintln!("waiting: {waiting}");
                for name in names {
                    wait_complete(&jobs, name).await;
                }
                let seen = seen.lock().unwrap().clone();
                assert!(
                    seen.most <= 2,
                    "{} reports ran at once on a semaphore of 2",
                    seen.most
                );
                assert_eq!(seen.started.len(), 3, "{seen:?}");
                let mut fences = std::collections::BTreeMap::new();
                for name in seen.order() {
                    let fence = pod_fences(&client, &ns, &name).await[0];
                    fences.insert(name, fence);
                }
                seen.assert_fences_rise(&fences);
            }
            other => panic!("examples/{other} has no check in tests/kueue/examples.rs"),
        }
        watch.abort();
    }
    controller.abort();
}
