//! What the alert and dashboard tests share: scrapes of a real controller's /metrics
//! captured once a second, the chart's PrometheusRule rendered by the real helm, a
//! `promtool test rules` file written from the capture, and the metric and label names
//! the rules and the dashboard reference.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use super::support::{self, eventually, tool};
use super::{TIMEOUT, get};

/// Scrapes of /metrics one second apart: scrape `i` is time `i`s in `promtool test
/// rules` (interval 1s). Missed scrapes keep their slot (empty), so times stay aligned.
pub struct Capture {
    scrapes: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Capture {
    pub fn start(port: u16) -> Capture {
        let scrapes = Arc::new(Mutex::new(Vec::new()));
        let into = scrapes.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let body = match get(port, "/metrics").await {
                    Some((200, body)) => body,
                    _ => String::new(),
                };
                into.lock().unwrap().push(body);
            }
        });
        Capture { scrapes, task }
    }

    /// Waits until a scrape taken from now on satisfies `check`; returns its index
    /// (the time at which an alert is expected in the promtool test).
    pub async fn mark_when(&self, what: &str, check: impl Fn(&str) -> bool) -> usize {
        let from = self.scrapes.lock().unwrap().len();
        eventually(what, TIMEOUT, || async {
            let scrapes = self.scrapes.lock().unwrap();
            (from..scrapes.len()).find(|&i| check(&scrapes[i]))
        })
        .await
    }

    /// The latest scrape with a body.
    pub fn latest(&self) -> String {
        let scrapes = self.scrapes.lock().unwrap();
        scrapes
            .iter()
            .rev()
            .find(|s| !s.is_empty())
            .cloned()
            .unwrap_or_default()
    }

    /// How many scrapes were taken.
    pub fn scraped(&self) -> usize {
        self.scrapes.lock().unwrap().len()
    }

    pub fn stop(self) -> Vec<String> {
        self.task.abort();
        self.scrapes.lock().unwrap().clone()
    }
}

/// The samples of an exposition: series (`name{labels}` as exposed) → value.
pub fn samples(body: &str) -> BTreeMap<String, String> {
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.rsplit_once(' '))
        .map(|(series, value)| (series.to_string(), value.to_string()))
        .collect()
}

/// The value of `series` (exactly as exposed) in `body`.
pub fn value(body: &str, series: &str) -> Option<f64> {
    samples(body).get(series)?.parse().ok()
}

/// `name{namespace="ns",backend="b"}`, as prometheus-client writes the labels.
pub fn pair(name: &str, ns: &str, backend: &str) -> String {
    format!("{name}{{namespace=\"{ns}\",backend=\"{backend}\"}}")
}

/// The chart's PrometheusRule `spec` (its `groups`), rendered by helm with `sets`.
pub fn rendered_rules(sets: &[&str]) -> Value {
    let mut all = vec!["monitoring.prometheusRule.enabled=true"];
    all.extend_from_slice(sets);
    let rule = helm_template("alerts", &all)
        .into_iter()
        .find(|obj| obj["kind"] == "PrometheusRule")
        .expect("a PrometheusRule in the rendered chart");
    rule["spec"].clone()
}

/// `helm template RELEASE charts/lockwarden --set …` for each of `sets`: the chart's
/// objects (YAML documents as JSON values).
fn helm_template(release: &str, sets: &[&str]) -> Vec<Value> {
    let chart = support::repo_root().join("charts/lockwarden");
    let home = support::work_dir("helm-home");
    let mut args = vec![
        "template".to_string(),
        release.into(),
        chart.display().to_string(),
        "--kube-version".into(),
        "1.36.0".into(),
    ];
    for set in sets {
        args.extend(["--set".to_string(), set.to_string()]);
    }
    let out = Command::new(tool("HELM"))
        .args(&args)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
        .expect("run helm template");
    assert!(
        out.status.success(),
        "helm template {sets:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_yaml_ng::Deserializer::from_str(&String::from_utf8_lossy(&out.stdout))
        .filter_map(|doc| serde::Deserialize::deserialize(doc).ok())
        .filter(|obj: &Value| obj.is_object())
        .collect()
}

/// Every rule of the groups.
pub fn rules(groups: &Value) -> Vec<Value> {
    groups["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .collect()
}

/// The dashboard's PromQL expressions (every panel target's `expr`).
pub fn dashboard_expressions() -> Vec<String> {
    let path = support::repo_root().join("charts/lockwarden/dashboards/lockwarden.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| t["expr"].as_str().expect("a target's expr").to_string())
        .collect()
}

/// The `lockwarden_*` metric names and the label names (`by (…)`, `{label…}`) an
/// expression references.
pub fn references(expr: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let words = |s: &str| -> Vec<String> {
        s.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| !w.is_empty())
            .map(String::from)
            .collect()
    };
    let metrics = words(expr)
        .into_iter()
        .filter(|w| w.starts_with("lockwarden_"))
        .collect();
    let mut labels = BTreeSet::new();
    for (i, _) in expr.match_indices(" by (") {
        let rest = &expr[i + 5..];
        let inside = &rest[..rest.find(')').expect("closing paren")];
        labels.extend(words(inside));
    }
    for (i, _) in expr.match_indices('{') {
        let rest = &expr[i + 1..];
        let inside = &rest[..rest.find('}').expect("closing brace")];
        for matcher in inside.split(',') {
            if let Some(name) = words(matcher).into_iter().next() {
                labels.insert(name);
            }
        }
    }
    (metrics, labels)
}

/// Checks that every metric and label `exprs` reference is in `body` (a scrape):
/// each metric has samples, and each label is on a sample of a metric of the same
/// expression. Fails naming what was renamed or is missing.
pub fn assert_referenced_names_are_exposed(exprs: &[String], body: &str) {
    let samples = samples(body);
    let series_of = |metric: &str| -> Vec<&String> {
        samples
            .keys()
            .filter(|s| s.split('{').next() == Some(metric))
            .collect()
    };
    for expr in exprs {
        let (metrics, labels) = references(expr);
        assert!(
            !metrics.is_empty(),
            "{expr} references no lockwarden metric"
        );
        for metric in &metrics {
            assert!(
                !series_of(metric).is_empty(),
                "{metric} (in `{expr}`) is not in /metrics:\n{body}"
            );
        }
        for label in &labels {
            let found = metrics.iter().any(|m| {
                series_of(m).iter().any(|s| {
                    s.contains(&format!("{{{label}=\"")) || s.contains(&format!(",{label}=\""))
                })
            });
            assert!(
                found,
                "label {label} (in `{expr}`) is on no sample of {metrics:?}"
            );
        }
    }
}

/// An alert expected at a time: its name and labels (besides `severity`).
pub struct Expected {
    pub at: usize,
    pub alert: &'static str,
    /// Each firing alert's labels; empty: the alert must not fire then.
    pub firing: Vec<BTreeMap<&'static str, String>>,
}

/// Writes `rules.yaml` (the groups) and `test.yaml` (`promtool test rules`: the
/// captured series and `expected`) into `dir`, and runs `promtool check rules` and
/// `promtool test rules` on them; fails with promtool's output.
pub fn promtool_test(dir: &Path, groups: &Value, scrapes: &[String], expected: &[Expected]) {
    std::fs::create_dir_all(dir).unwrap();
    let rules_file = dir.join("rules.yaml");
    // JSON is YAML: promtool reads it as a rules file.
    std::fs::write(&rules_file, serde_json::to_string_pretty(groups).unwrap()).unwrap();
    promtool(&["check", "rules", &rules_file.display().to_string()]);

    let parsed: Vec<BTreeMap<String, String>> = scrapes.iter().map(|s| samples(s)).collect();
    let names: BTreeSet<&String> = parsed.iter().flat_map(|s| s.keys()).collect();
    let input_series: Vec<Value> = names
        .into_iter()
        .map(|series| {
            let values: Vec<&str> = parsed
                .iter()
                .map(|s| s.get(series.as_str()).map_or("_", String::as_str))
                .collect();
            json!({ "series": series, "values": values.join(" ") })
        })
        .collect();
    let by_name: BTreeMap<String, Value> = rules(groups)
        .into_iter()
        .map(|r| (r["alert"].as_str().unwrap_or_default().to_string(), r))
        .collect();
    let alert_tests: Vec<Value> = expected
        .iter()
        .map(|e| {
            let rule = by_name
                .get(e.alert)
                .unwrap_or_else(|| panic!("no alert {} in the rendered rules", e.alert));
            let exp_alerts: Vec<Value> = e
                .firing
                .iter()
                .map(|labels| {
                    let mut all: BTreeMap<String, String> = labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.clone()))
                        .collect();
                    all.insert("severity".into(), rule["labels"]["severity"].as_str().unwrap().into());
                    let annotations: BTreeMap<String, String> = rule["annotations"]
                        .as_object()
                        .unwrap()
                        .iter()
                        .map(|(k, v)| (k.clone(), expand(v.as_str().unwrap(), labels)))
                        .collect();
                    json!({ "exp_labels": all, "exp_annotations": annotations })
                })
                .collect();
            json!({ "eval_time": format!("{}s", e.at), "alertname": e.alert, "exp_alerts": exp_alerts })
        })
        .collect();
    let test = json!({
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1s",
        "tests": [{ "interval": "1s", "input_series": input_series, "alert_rule_test": alert_tests }],
    });
    let test_file = dir.join("test.yaml");
    std::fs::write(&test_file, serde_json::to_string_pretty(&test).unwrap()).unwrap();
    promtool(&["test", "rules", &test_file.display().to_string()]);
}

/// An annotation template with `{{ $labels.NAME }}` replaced as Prometheus would.
fn expand(template: &str, labels: &BTreeMap<&'static str, String>) -> String {
    let mut out = template.to_string();
    for (name, value) in labels {
        out = out.replace(&format!("{{{{ $labels.{name} }}}}"), value);
    }
    assert!(
        !out.contains("{{"),
        "an annotation uses more than labels: {template}"
    );
    out
}

/// Runs promtool; fails with its output unless it succeeds.
pub fn promtool(args: &[&str]) -> String {
    let out = Command::new(tool("PROMTOOL"))
        .args(args)
        .output()
        .expect("run promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

/// A directory for this test's promtool files.
pub fn promtool_dir(name: &str) -> PathBuf {
    support::work_dir(&format!("promtool-{name}"))
}

/// The labels of one alert.
pub fn labels(pairs: &[(&'static str, &str)]) -> BTreeMap<&'static str, String> {
    pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

/// The chart's objects rendered with `sets` (YAML documents as JSON values).
fn rendered(sets: &[&str]) -> Vec<Value> {
    helm_template("dash", sets)
}

/// The dashboard and the rules are opt-in; enabled, the ConfigMap carries the sidecar
/// label (configurable) and the dashboard file byte for byte.
#[test]
fn the_chart_renders_the_dashboard_and_the_rules_only_when_asked() {
    let kinds = |objs: &[Value]| -> Vec<String> {
        objs.iter()
            .map(|o| o["kind"].as_str().unwrap_or_default().to_string())
            .collect()
    };
    let default = rendered(&[]);
    assert!(!kinds(&default).contains(&"PrometheusRule".to_string()));
    assert!(
        !default
            .iter()
            .any(|o| o["metadata"]["name"] == "dash-lockwarden-dashboard"),
        "the dashboard is rendered by default"
    );
    let enabled = rendered(&[
        "monitoring.dashboard.enabled=true",
        "monitoring.dashboard.label=my_dashboards",
        "monitoring.prometheusRule.enabled=true",
    ]);
    assert!(kinds(&enabled).contains(&"PrometheusRule".to_string()));
    let map = enabled
        .iter()
        .find(|o| o["metadata"]["name"] == "dash-lockwarden-dashboard")
        .expect("the dashboard ConfigMap");
    assert_eq!(map["kind"], "ConfigMap");
    assert_eq!(map["metadata"]["labels"]["my_dashboards"], "1");
    let file = support::repo_root().join("charts/lockwarden/dashboards/lockwarden.json");
    let expected = std::fs::read_to_string(file).unwrap();
    assert_eq!(
        map["data"]["lockwarden.json"].as_str().map(str::trim_end),
        Some(expected.trim_end())
    );
}

/// `dashcheck FILE` (tests/monitoring), its output.
fn dashcheck(file: &Path) -> std::process::Output {
    Command::new(tool("LOCKWARDEN_DASHCHECK"))
        .arg(file)
        .output()
        .expect("run dashcheck")
}

/// The dashboard against an openly licensed schema (grafana-foundation-sdk's type,
/// decoded strictly) and every expression through Prometheus' PromQL parser, by
/// `dashcheck` (tests/monitoring).
#[test]
fn the_dashboard_matches_the_open_schema_and_its_promql_parses() {
    let file = support::repo_root().join("charts/lockwarden/dashboards/lockwarden.json");
    let out = dashcheck(&file);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "dashcheck failed:\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let parsed: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("parsed: "))
        .collect();
    assert_eq!(parsed, dashboard_expressions(), "{stdout}");
    // The checks bite: a field the schema does not know, and an expression that does
    // not parse, each fail.
    let original: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let dir = support::work_dir("dashcheck");
    let mut unknown = original.clone();
    unknown["panels"][0]["bogus"] = json!(1);
    let mut unparsable = original;
    unparsable["panels"][0]["targets"][0]["expr"] = json!("sum by (phase (lockwarden_locks)");
    for (name, broken, says) in [
        ("unknown-field.json", unknown, "unexpected field 'bogus'"),
        ("unparsable.json", unparsable, "does not parse"),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, serde_json::to_string(&broken).unwrap()).unwrap();
        let out = dashcheck(&path);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(says),
            "{name}: {stderr}"
        );
    }
    // And the rules: promtool parses every expression of the rendered groups.
    let dir = promtool_dir("check");
    let rules_file = dir.join("rules.yaml");
    let groups = rendered_rules(&[]);
    std::fs::write(&rules_file, serde_json::to_string_pretty(&groups).unwrap()).unwrap();
    let checked = promtool(&["check", "rules", &rules_file.display().to_string()]);
    assert!(checked.contains("SUCCESS: 5 rules found"), "{checked}");
}
