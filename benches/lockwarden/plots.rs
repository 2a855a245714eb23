//! The two plots issue 18 asks for, as plain SVG: same-cluster hand-off latency per
//! backend (every sample, its p50 and the goal), and renewals per second against the
//! number of locks held (scale part).

use super::output::{COLORS, fmt};
use super::*;

const HEAD: &str = "font-family=\"sans-serif\" font-size=\"11\"";

/// A line through `points` (already in SVG coordinates), drawn in `color`.
pub(crate) fn polyline(points: impl IntoIterator<Item = (f64, f64)>, color: &str) -> String {
    let mut d = String::new();
    for (k, (x, y)) in points.into_iter().enumerate() {
        let _ = write!(d, "{}{x:.1},{y:.1} ", if k == 0 { "M" } else { "L" });
    }
    format!("<path d=\"{d}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\"/>\n")
}

fn svg_open(w: f64, h: f64, title: &str) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" {HEAD}>\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"10\" y=\"18\" font-size=\"13\" font-weight=\"bold\">{title}</text>\n"
    )
}

/// One row per backend: each hand-off sample as a dot, the p50 as a bar, the goal
/// (issue 18: 15 ms on Leases and ZooKeeper, 2 × floor + 15 ms on S3 and DynamoDB)
/// as a dashed line.
pub(crate) fn render_handoff_svg(r: &Report) -> String {
    let rows: Vec<(Kind, &Vec<f64>)> = KINDS
        .iter()
        .filter_map(|k| {
            r.plots
                .iter()
                .find(|p| p.0 == *k && p.1.contains("same-cluster hand-off"))
                .map(|p| (*k, &p.2))
        })
        .collect();
    let goal = |k: Kind| match k {
        Kind::S3 | Kind::DynamoDb => r.floors.get(&k).map_or(f64::NAN, |f| 2.0 * f.p50 + 15.0),
        _ => 15.0,
    };
    let (w, row_h, ml, mr, mt) = (760.0, 56.0, 90.0, 20.0, 36.0);
    let h = mt + row_h * rows.len().max(1) as f64 + 40.0;
    let mut svg = svg_open(
        w,
        h,
        "Same-cluster hand-off: delete of the holder → waiter Acquired (ms)",
    );
    let hi = rows
        .iter()
        .flat_map(|(k, s)| s.iter().copied().chain([goal(*k)]))
        .filter(|v| v.is_finite())
        .fold(10.0, f64::max)
        * 1.05;
    let xs = |v: f64| ml + v / hi * (w - ml - mr);
    let bottom = mt + row_h * rows.len() as f64;
    let step = if hi > 100.0 { 20.0 } else { 5.0 };
    let mut t = 0.0;
    while t <= hi {
        let x = xs(t);
        let _ = writeln!(
            svg,
            "<line x1=\"{x:.1}\" y1=\"{mt}\" x2=\"{x:.1}\" y2=\"{bottom}\" stroke=\"#eee\"/><text x=\"{x:.1}\" y=\"{}\" text-anchor=\"middle\">{t}</text>",
            bottom + 14.0
        );
        t += step;
    }
    for (i, (kind, samples)) in rows.iter().enumerate() {
        let y = mt + row_h * (i as f64 + 0.5);
        let color = COLORS[(i + 1) % COLORS.len()];
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
            ml - 8.0,
            y + 4.0,
            kind.name()
        );
        for (j, v) in samples.iter().enumerate() {
            let dy = ((j % 5) as f64 - 2.0) * 4.0;
            let _ = writeln!(
                svg,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{color}\" fill-opacity=\"0.6\"/>",
                xs(*v),
                y + dy
            );
        }
        let p50 = pct(samples, 0.5);
        let g = goal(*kind);
        let _ = writeln!(
            svg,
            "<line x1=\"{x:.1}\" y1=\"{}\" x2=\"{x:.1}\" y2=\"{}\" stroke=\"black\" stroke-width=\"2\"/><text x=\"{x:.1}\" y=\"{}\" text-anchor=\"middle\">p50 {} ms</text>",
            y - 14.0,
            y + 14.0,
            y - 17.0,
            fmt(p50),
            x = xs(p50)
        );
        if g.is_finite() {
            let _ = writeln!(
                svg,
                "<line x1=\"{x:.1}\" y1=\"{}\" x2=\"{x:.1}\" y2=\"{}\" stroke=\"#d62728\" stroke-dasharray=\"4,3\" stroke-width=\"1.5\"/><text x=\"{:.1}\" y=\"{}\" fill=\"#d62728\">goal {} ms</text>",
                y - 20.0,
                y + 20.0,
                xs(g) + 3.0,
                y + 20.0,
                fmt(g),
                x = xs(g)
            );
        }
    }
    svg.push_str("</svg>\n");
    svg
}

/// Renewals per second in the steady-state window against locks held, log-log, one
/// series per backend and path (engine in one process, or the operator), with the
/// rate the renew interval asks for as a hollow marker.
pub(crate) fn render_scale_svg(r: &Report) -> String {
    let (w, h, ml, mr, mt, mb) = (760.0, 420.0, 70.0, 20.0, 36.0, 110.0);
    let mut svg = svg_open(
        w,
        h,
        "Renewals per second against locks held (log-log; hollow: what the interval asks for)",
    );
    let points: Vec<(&ScaleRow, f64, f64)> = r
        .scale
        .iter()
        .map(|s| (s, s.renewals / s.hold_s, s.locks as f64 / s.interval_s))
        .filter(|(_, got, _)| got.is_finite() && *got > 0.0)
        .collect();
    if points.is_empty() {
        svg.push_str("<text x=\"20\" y=\"60\">no scale run in this report</text>\n</svg>\n");
        return svg;
    }
    let (x_lo, x_hi) = (2.0, 4.5); // 100 .. ~30,000 locks
    let y_lo = points
        .iter()
        .map(|p| p.1.min(p.2))
        .fold(f64::INFINITY, f64::min)
        .log10()
        .floor();
    let y_hi = points
        .iter()
        .map(|p| p.1.max(p.2))
        .fold(0.0, f64::max)
        .log10()
        .ceil()
        .max(y_lo + 1.0);
    let (x0, x1, y0, y1) = (ml, w - mr, mt, h - mb);
    let xs = |n: f64| x0 + (n.log10() - x_lo) / (x_hi - x_lo) * (x1 - x0);
    let ys = |v: f64| y1 - (v.log10() - y_lo) / (y_hi - y_lo) * (y1 - y0);
    let _ = writeln!(
        svg,
        "<rect x=\"{x0}\" y=\"{y0}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#888\"/>",
        x1 - x0,
        y1 - y0
    );
    for n in [100.0, 300.0, 1000.0, 3000.0, 10_000.0, 30_000.0] {
        let x = xs(n);
        let _ = writeln!(
            svg,
            "<line x1=\"{x:.1}\" y1=\"{y0}\" x2=\"{x:.1}\" y2=\"{y1}\" stroke=\"#eee\"/><text x=\"{x:.1}\" y=\"{}\" text-anchor=\"middle\">{n}</text>",
            y1 + 14.0
        );
    }
    let _ = writeln!(
        svg,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">locks held</text>",
        (x0 + x1) / 2.0,
        y1 + 30.0
    );
    let mut d = y_lo;
    while d <= y_hi {
        let y = ys(10f64.powf(d));
        let _ = writeln!(
            svg,
            "<line x1=\"{x0}\" y1=\"{y:.1}\" x2=\"{x1}\" y2=\"{y:.1}\" stroke=\"#eee\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            x0 - 4.0,
            y + 4.0,
            10f64.powf(d)
        );
        d += 1.0;
    }
    let mut series: Vec<(String, String)> = Vec::new();
    for (s, _, _) in &points {
        let path = if s.path.starts_with("operator") {
            "operator"
        } else {
            "engine"
        };
        let key = (s.kind.clone(), path.to_string());
        if !series.contains(&key) {
            series.push(key);
        }
    }
    for (i, (kind, path)) in series.iter().enumerate() {
        let color = COLORS[(i + 1) % COLORS.len()];
        let mut mine: Vec<_> = points
            .iter()
            .filter(|(s, _, _)| &s.kind == kind && s.path.starts_with(path.as_str()))
            .collect();
        mine.sort_by_key(|(s, _, _)| s.locks);
        for (s, got, asked) in &mine {
            let (x, y) = (xs(s.locks as f64), ys(*got));
            let _ = writeln!(
                svg,
                "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"4\" fill=\"{color}\"/><circle cx=\"{x:.1}\" cy=\"{:.1}\" r=\"6\" fill=\"none\" stroke=\"{color}\"/><text x=\"{:.1}\" y=\"{:.1}\" fill=\"{color}\">{:.0}/s, missed {}</text>",
                ys(*asked),
                x + 8.0,
                // Series one above the other, so that labels of equal points do not overlap.
                y - 6.0 + 12.0 * i as f64,
                got,
                fmt(s.missed)
            );
        }
        svg.push_str(&polyline(
            mine.iter()
                .map(|(s, got, _)| (xs(s.locks as f64), ys(*got))),
            color,
        ));
        let ly = y1 + 50.0 + i as f64 * 13.0;
        let _ = writeln!(
            svg,
            "<circle cx=\"{}\" cy=\"{}\" r=\"4\" fill=\"{color}\"/><text x=\"{}\" y=\"{ly}\">{kind}, {path}</text>",
            x0 + 6.0,
            ly - 4.0,
            x0 + 16.0
        );
    }
    svg.push_str("</svg>\n");
    svg
}
