//! Output: the markdown table in docs/benchmarks.md, the SVG plot, the JSON results.

use super::*;

// ---------------------------------------------------------------------------------
// Output: markdown, SVG, JSON

pub(crate) fn fmt(v: f64) -> String {
    if v.is_nan() {
        "–".into()
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

pub(crate) fn met(ok: bool) -> &'static str {
    if ok { "**met**" } else { "**not met**" }
}

pub(crate) fn render_markdown(r: &Report, opts: &Opts, elapsed: Duration, build: &str) -> String {
    let mut md = String::new();
    let when = humantime::format_rfc3339_seconds(SystemTime::now());
    let _ = writeln!(
        md,
        "Run {when}, `{}`, {build} build, {:.1} min, on this machine ({} CPUs){}. Every figure is from this one run; \
         the floor is the bare conditional write with the raw SDK/client on the same server, measured first.\n",
        if opts.quick {
            "scripts/bench --quick"
        } else {
            "scripts/bench"
        },
        elapsed.as_secs_f64() / 60.0,
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        r.aws_servers
            .map(|(s3, ddb)| format!("; S3 on {s3}, DynamoDB on {ddb}"))
            .unwrap_or_default()
    );
    md.push_str("### Floor (part 1)\n\n| backend | raw conditional write | n | p50 ms | p99 ms | create-if-absent p50 ms | throughput, writes/s |\n|---|---|---|---|---|---|---|\n");
    for (kind, f) in &r.floors {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {:.0} ({} writers) |",
            kind.name(),
            kind.floor_op(),
            f.n,
            fmt(f.p50),
            fmt(f.p99),
            fmt(f.create_p50),
            f.ops_per_s,
            f.writers
        );
    }
    for (part, title) in [
        ("engine", "Engine (part 2)"),
        ("operator", "Operator end to end (part 3)"),
        (
            "permits",
            "Permits (part 5): one permit among other holders of the key",
        ),
    ] {
        let _ = writeln!(
            md,
            "\n### {title}\n\n| backend | measurement | n | p50 ms | p99 ms | p50 / floor p50 | round trips per op (counted) | floor p50 ms (n) |\n|---|---|---|---|---|---|---|---|"
        );
        for row in r.rows.iter().filter(|x| x.part == part) {
            let floor = r.floors.get(&row.kind);
            let (fp, fnn) = floor.map_or((f64::NAN, 0), |f| (f.p50, f.n));
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {}× | {} | {} ({}) |",
                row.kind.name(),
                row.what,
                row.n,
                fmt(row.p50),
                fmt(row.p99),
                fmt(row.p50 / fp),
                row.round_trips.map_or("–".into(), fmt),
                fmt(fp),
                fnn
            );
        }
        if part == "engine" && !r.throughput.is_empty() {
            md.push_str("\nThroughput: acquire+release cycles on 16 keys per writer, 8 writers, counted as conditional writes/s (2 per cycle on S3/DynamoDB/Lease; ZooKeeper's cycle is create + list + delete), against the floor's raw conditional writes/s with the same number of writers. *Store layer*: the same acquisition and release records written through lockwarden's store layer alone (no engine: no reads, no observation), same writers and keys; *store write p50*: one such write, chained on one key:\n\n| backend | engine writes/s | raw writes/s | engine / raw | store layer writes/s | store layer / raw | engine / store layer | store write p50 ms (/ floor) |\n|---|---|---|---|---|---|---|---|\n");
            for (kind, e, raw, _) in &r.throughput {
                let store = r.store_throughput.get(kind);
                let floor = r.floors.get(kind).map_or(f64::NAN, |f| f.p50);
                let _ = writeln!(
                    md,
                    "| {} | {:.0} | {:.0} | {:.0} % | {} | {} | {} | {} |",
                    kind.name(),
                    e,
                    raw,
                    100.0 * e / raw,
                    store.map_or("–".into(), |s| format!("{s:.0}")),
                    store.map_or("–".into(), |s| format!("{:.0} %", 100.0 * s / raw)),
                    store.map_or("–".into(), |s| format!("{:.0} %", 100.0 * e / s)),
                    r.store_write_p50.get(kind).map_or("–".into(), |p| format!(
                        "{} ({}×)",
                        fmt(*p),
                        fmt(p / floor)
                    )),
                );
            }
        }
    }
    if !r.cli.is_empty() {
        md.push_str("\n### CLI start-up (part 6)\n\nOne `lockwarden lock` + `lockwarden unlock` cycle (two processes) against a Go tool doing the same job on the same server in the same run (`tests/interop`: s3lock's protocol on S3, dynamolock's item format on DynamoDB), p50 per cycle: wall and CPU summed over the two processes, peak RSS the larger of the two. Goals (issue 18): wall ≤ 1.0×, CPU ≤ 0.7×, peak RSS ≤ 1.0×.\n\n| backend | n | wall ms (lockwarden / Go) | ratio | CPU ms (lockwarden / Go) | ratio | peak RSS MiB (lockwarden / Go) | ratio |\n|---|---|---|---|---|---|---|---|\n");
        for c in &r.cli {
            let _ = writeln!(
                md,
                "| {} | {} | {} / {} | {}× ({}) | {} / {} | {}× ({}) | {} / {} | {}× ({}) |",
                c.kind.name(),
                c.n,
                fmt(c.wall.0),
                fmt(c.wall.1),
                fmt(c.wall.0 / c.wall.1),
                met(c.wall.0 <= c.wall.1),
                fmt(c.cpu.0),
                fmt(c.cpu.1),
                fmt(c.cpu.0 / c.cpu.1),
                met(c.cpu.0 <= 0.7 * c.cpu.1),
                fmt(c.rss.0),
                fmt(c.rss.1),
                fmt(c.rss.0 / c.rss.1),
                met(c.rss.0 <= c.rss.1),
            );
        }
    }
    if !r.scale.is_empty() {
        md.push_str("\n### Scale (part 4)\n\n| backend | path | locks | renew interval s | window s | acquire all s | renewals in window (expected) | missed | CPU % of a core per 1,000 renewals/s | peak RSS MB | RSS per 1,000 locks MB | status writes per renewal |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
        for s in &r.scale {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.0} | {:.0} | {} | {:.0} ({:.0}) | {} | {} | {} | {} | {} |",
                s.kind,
                s.path,
                s.locks,
                s.interval_s,
                s.hold_s,
                fmt(s.acquire_all_s),
                s.renewals,
                s.renewals_expected,
                fmt(s.missed),
                fmt(s.cpu_per_1k_renewals_per_s),
                fmt(s.peak_rss_mb),
                fmt(s.rss_per_1k_mb),
                s.status_writes_per_renewal.map_or("–".into(), fmt)
            );
        }
        for s in &r.scale {
            let _ = writeln!(md, "\n- {} {} × {}: {}", s.kind, s.path, s.locks, s.note);
        }
        if let Some((server, c)) = r.s3_capacity {
            let _ = writeln!(
                md,
                "- {server} capacity measured in this run: {c:.0} conditional PUTs/s (8 writers); the S3 renew interval is lengthened so renewals stay under half of it."
            );
        }
        let growth = |kind: &str| {
            let a = r
                .scale
                .iter()
                .find(|s| s.kind == kind && s.locks == 1000 && s.path.starts_with("engine"));
            let b = r
                .scale
                .iter()
                .find(|s| s.kind == kind && s.locks == 10_000 && s.path.starts_with("engine"));
            a.zip(b)
        };
        for kind in ["zookeeper", "s3"] {
            if let Some((a, b)) = growth(kind) {
                let _ = writeln!(
                    md,
                    "- {kind} growth 1k → 10k: acquire-all {}×, CPU per 1,000 renewals/s {}×, RSS per 1,000 locks {}×, missed {} → {}",
                    fmt(b.acquire_all_s / a.acquire_all_s),
                    fmt(b.cpu_per_1k_renewals_per_s / a.cpu_per_1k_renewals_per_s),
                    fmt(b.rss_per_1k_mb / a.rss_per_1k_mb),
                    a.missed,
                    b.missed
                );
            }
        }
    }
    if let Some(node) = &r.node {
        md.push_str("\n### Job hand-off on a real node (part 7)\n\nTwo gated Jobs in turn on one DistributedLock (a Kubernetes Lease lock) on a real node (kubelet, containerd, kube-scheduler; the controller in the benchmark process), against an ungated Job's start in the same run, the samples alternating. Times are read on the host clock: the containers register `$EPOCHREALTIME` in a hostPath file; the stages are when a watch of the Jobs and the lock first saw each step.\n\n| measurement | n | p50 ms | p90 ms | min ms | max ms | p50 / floor p50 |\n|---|---|---|---|---|---|---|\n");
        for row in [&node.handoff, &node.lockwarden, &node.start, &node.floor] {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {}× |",
                row.what,
                row.n,
                fmt(row.p50),
                fmt(row.p90),
                fmt(row.min),
                fmt(row.max),
                fmt(row.p50 / node.floor.p50)
            );
        }
        md.push_str("\nThe hand-off's stages, each from the one before (p50s need not add up to the total's):\n\n| stage | n | p50 ms | p90 ms | min ms | max ms |\n|---|---|---|---|---|---|\n");
        for row in &node.stages {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} |",
                row.what,
                row.n,
                fmt(row.p50),
                fmt(row.p90),
                fmt(row.min),
                fmt(row.max)
            );
        }
    }
    md.push_str(&goals::render_goals(r));
    if !r.notes.is_empty() {
        md.push_str("\n### Notes from this run\n\n");
        for n in &r.notes {
            let _ = writeln!(md, "- {n}");
        }
    }
    md.push_str("\n![Latency distributions](benchmarks.svg)\n\n![Same-cluster hand-off per backend](benchmarks-handoff.svg)\n\n![Renewals per second against locks held](benchmarks-scale.svg)\n");
    md
}

pub(crate) const COLORS: [&str; 10] = [
    "#000000", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
    "#17becf", "#bcbd22",
];

/// Latency CDFs, one panel per backend, log-scale time axis.
pub(crate) fn render_svg(r: &Report) -> String {
    let (pw, ph) = (560.0, 330.0);
    let (ml, mr, mt, mb) = (50.0, 10.0, 28.0, 120.0);
    let all: Vec<f64> = r
        .plots
        .iter()
        .flat_map(|p| p.2.iter().copied())
        .filter(|v| *v > 0.0)
        .collect();
    let lo = all
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min)
        .max(0.05)
        .log10()
        .floor();
    let hi = all
        .iter()
        .copied()
        .fold(0.0, f64::max)
        .max(1.0)
        .log10()
        .ceil();
    let mut svg = String::new();
    let (w, h) = (2.0 * pw, 2.0 * ph);
    let _ = writeln!(
        svg,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>"
    );
    for (i, kind) in KINDS.iter().enumerate() {
        let (ox, oy) = ((i % 2) as f64 * pw, (i / 2) as f64 * ph);
        let (x0, y0, x1, y1) = (ox + ml, oy + mt, ox + pw - mr, oy + ph - mb);
        let xs = |v: f64| x0 + (v.max(1e-3).log10() - lo) / (hi - lo) * (x1 - x0);
        let ys = |q: f64| y1 - q * (y1 - y0);
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{}\" font-size=\"13\" font-weight=\"bold\">{} — latency CDF (ms, log scale)</text>",
            x0,
            oy + 16.0,
            kind.name()
        );
        let _ = writeln!(
            svg,
            "<rect x=\"{x0}\" y=\"{y0}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#888\"/>",
            x1 - x0,
            y1 - y0
        );
        let mut d = lo;
        while d <= hi {
            let x = xs(10f64.powf(d));
            let _ = writeln!(
                svg,
                "<line x1=\"{x}\" y1=\"{y0}\" x2=\"{x}\" y2=\"{y1}\" stroke=\"#ddd\"/><text x=\"{x}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                y1 + 12.0,
                10f64.powf(d)
            );
            d += 1.0;
        }
        for q in [0.5, 0.99] {
            let y = ys(q);
            let _ = writeln!(
                svg,
                "<line x1=\"{x0}\" y1=\"{y}\" x2=\"{x1}\" y2=\"{y}\" stroke=\"#ddd\" stroke-dasharray=\"3,3\"/><text x=\"{}\" y=\"{}\" text-anchor=\"end\">p{}</text>",
                x0 - 3.0,
                y + 4.0,
                (q * 100.0) as u32
            );
        }
        let series: Vec<_> = r
            .plots
            .iter()
            .filter(|p| p.0 == *kind && !p.2.is_empty())
            .collect();
        for (j, (_, label, samples)) in series.iter().enumerate() {
            let mut v = samples.clone();
            v.sort_by(|a, b| a.total_cmp(b));
            let color = COLORS[j % COLORS.len()];
            let cdf = v.iter().enumerate();
            svg.push_str(&super::plots::polyline(
                cdf.map(|(k, s)| (xs(*s), ys((k + 1) as f64 / v.len() as f64))),
                color,
            ));
            let ly = y1 + 24.0 + j as f64 * 12.0;
            let _ = writeln!(
                svg,
                "<line x1=\"{x0}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{color}\" stroke-width=\"2\"/><text x=\"{}\" y=\"{ly}\">{} (n={}, p50 {} ms)</text>",
                ly - 4.0,
                x0 + 18.0,
                ly - 4.0,
                x0 + 22.0,
                label
                    .replace('→', "-&gt;")
                    .replace('&', "&amp;")
                    .replace("&amp;gt;", "&gt;"),
                v.len(),
                fmt(pct(&v, 0.5))
            );
        }
    }
    svg.push_str("</svg>\n");
    svg
}

pub(crate) fn results_json(r: &Report) -> Value {
    json!({
        "floors": r.floors.iter().map(|(k, f)| json!({"backend": k.name(), "n": f.n, "p50_ms": f.p50, "p99_ms": f.p99, "ops_per_s": f.ops_per_s})).collect::<Vec<_>>(),
        "rows": r.rows.iter().map(|x| json!({"part": x.part, "backend": x.kind.name(), "what": x.what, "n": x.n, "p50_ms": x.p50, "p99_ms": x.p99, "round_trips": x.round_trips})).collect::<Vec<_>>(),
        "throughput": r.throughput.iter().map(|(k, e, raw, w)| json!({"backend": k.name(), "engine_writes_per_s": e, "raw_writes_per_s": raw, "writers": w})).collect::<Vec<_>>(),
        "scale": r.scale.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>(),
        "node": r.node.as_ref().map(|n| {
            let row = |x: &NodeRow| json!({"what": x.what, "n": x.n, "p50_ms": x.p50, "p90_ms": x.p90, "min_ms": x.min, "max_ms": x.max});
            json!({"handoff": row(&n.handoff), "lockwarden": row(&n.lockwarden), "start": row(&n.start), "floor": row(&n.floor), "ratio_p50": n.handoff.p50 / n.floor.p50, "stages": n.stages.iter().map(row).collect::<Vec<_>>()})
        }),
        "notes": r.notes,
    })
}

pub(crate) const BEGIN: &str = "<!-- BEGIN GENERATED by scripts/bench: do not edit by hand -->";
pub(crate) const END: &str = "<!-- END GENERATED -->";

pub(crate) fn write_outputs(r: &Report, opts: &Opts, elapsed: Duration) {
    let build = if cfg!(debug_assertions) {
        "**debug** (unoptimized: CPU figures overstate)"
    } else {
        "optimized (`cargo bench` profile)"
    };
    let root = support::repo_root();
    let out_dir = std::env::var_os("LOCKWARDEN_BENCH_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("docs"));
    std::fs::create_dir_all(&out_dir).unwrap();
    let generated = render_markdown(r, opts, elapsed, build);
    let doc_path = out_dir.join("benchmarks.md");
    let existing = std::fs::read_to_string(&doc_path).unwrap_or_default();
    let doc = match (existing.find(BEGIN), existing.find(END)) {
        (Some(b), Some(e)) if b < e => {
            format!("{}{BEGIN}\n{generated}{}", &existing[..b], &existing[e..])
        }
        _ => format!("# Benchmarks\n\n{BEGIN}\n{generated}{END}\n"),
    };
    std::fs::write(&doc_path, doc).unwrap();
    std::fs::write(out_dir.join("benchmarks.svg"), render_svg(r)).unwrap();
    std::fs::write(
        out_dir.join("benchmarks-handoff.svg"),
        plots::render_handoff_svg(r),
    )
    .unwrap();
    std::fs::write(
        out_dir.join("benchmarks-scale.svg"),
        plots::render_scale_svg(r),
    )
    .unwrap();
    let json_path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench-results.json");
    std::fs::write(
        &json_path,
        serde_json::to_string_pretty(&results_json(r)).unwrap(),
    )
    .unwrap();
    eprintln!(
        "[bench] wrote {}, benchmarks{{,-handoff,-scale}}.svg and {}",
        doc_path.display(),
        json_path.display()
    );
}
