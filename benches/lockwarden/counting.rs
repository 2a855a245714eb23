//! Counting round trips: an AWS SDK interceptor, kube-apiserver `/metrics`, ZooKeeper
//! `mntr` packets.

use super::*;

// ---------------------------------------------------------------------------------
// Counting round trips

/// Counts every HTTP attempt an AWS SDK client transmits.
#[derive(Clone, Debug, Default)]
pub(crate) struct AttemptCounter(pub(crate) Arc<AtomicU64>);

impl Intercept for AttemptCounter {
    fn name(&self) -> &'static str {
        "AttemptCounter"
    }
    fn read_before_transmit(
        &self,
        _context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Sums `apiserver_request_total` per (resource, subresource, verb).
pub(crate) async fn apiserver_counts(client: &Client) -> HashMap<(String, String, String), f64> {
    let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = client.request_text(req).await.expect("apiserver /metrics");
    let mut out = HashMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{name}=\"")))
                .map(|v| v.trim_end_matches('"').to_string())
                .unwrap_or_default()
        };
        *out.entry((label("resource"), label("subresource"), label("verb")))
            .or_insert(0.0) += value.trim().parse::<f64>().unwrap_or(0.0);
    }
    out
}

pub(crate) fn api_sum(
    counts: &HashMap<(String, String, String), f64>,
    resource: &str,
    writes_only: bool,
) -> f64 {
    counts
        .iter()
        .filter(|((r, _, v), _)| {
            r == resource
                && (!writes_only
                    || matches!(v.as_str(), "PUT" | "PATCH" | "POST" | "APPLY" | "DELETE"))
        })
        .map(|(_, n)| n)
        .sum()
}

pub(crate) fn zk_packets(zk: &ZooKeeper) -> f64 {
    let out = zk.node(0).four_letter("mntr").expect("ZooKeeper mntr");
    out.lines()
        .find_map(|l| l.strip_prefix("zk_packets_received"))
        .and_then(|v| v.trim().parse().ok())
        .expect("zk_packets_received in mntr (4lw.commands.whitelist)")
}
