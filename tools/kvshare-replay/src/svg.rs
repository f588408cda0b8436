//! The plots, as self-contained SVGs (no dependency): device pages in use over (simulated) time,
//! without sharing, with kvshare and ideal ([`plot`]); and curves of a value against a
//! log-scaled quantity, such as prefix hits against capacity ([`plot_curves`]).

use std::fmt::Write as _;

use super::outcome::StepPages;

/// A "nice" tick step (1, 2 or 5 × 10^k) giving about `target` ticks over `span`.
fn nice_step(span: f64, target: f64) -> f64 {
    let raw = (span / target).max(1e-9);
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let m = if f < 1.5 {
        1.0
    } else if f < 3.5 {
        2.0
    } else if f < 7.5 {
        5.0
    } else {
        10.0
    };
    m * mag
}

/// At most `max_points` points per series: each bucket keeps its maximum (so peaks survive).
fn downsample(per_step: &[StepPages], max_points: usize) -> Vec<(f64, [u32; 3])> {
    let n = per_step.len();
    let bucket = n.div_ceil(max_points.max(1)).max(1);
    per_step
        .chunks(bucket)
        .map(|c| {
            let mut m = [0u32; 3];
            for s in c {
                m[0] = m[0].max(s.no_sharing);
                m[1] = m[1].max(s.kvshare);
                m[2] = m[2].max(s.ideal);
            }
            (c[c.len() - 1].time_ms / 1e3, m)
        })
        .collect()
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The SVG document.
pub fn plot(per_step: &[StepPages], title: &str, device_pages: u32) -> String {
    let (w, h) = (960.0, 440.0);
    let (ml, mr, mt, mb) = (72.0, 24.0, 48.0, 56.0);
    let (pw, ph) = (w - ml - mr, h - mt - mb);
    let pts = downsample(per_step, 1200);
    let t_max = pts.last().map_or(1.0, |p| p.0).max(1e-3);
    let y_data = pts
        .iter()
        .map(|p| p.1.iter().copied().max().unwrap_or(0))
        .max()
        .unwrap_or(0)
        .max(device_pages) as f64;
    let y_step = nice_step(y_data, 6.0);
    let y_max = (y_data / y_step).ceil() * y_step;
    let x_step = nice_step(t_max, 10.0);
    let x = |t: f64| ml + pw * t / t_max;
    let y = |v: f64| mt + ph * (1.0 - v / y_max);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="24" text-anchor="middle" font-size="15">{}</text>"#,
        w / 2.0,
        esc(title)
    );
    // Grid and ticks.
    let mut v = 0.0;
    while v <= y_max + 1e-9 {
        let yy = y(v);
        let _ = writeln!(
            s,
            r##"<line x1="{ml}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#e5e5e5"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            ml + pw,
            ml - 6.0,
            yy + 4.0,
            v as u64
        );
        v += y_step;
    }
    let mut t = 0.0;
    while t <= t_max + 1e-9 {
        let xx = x(t);
        let _ = writeln!(
            s,
            r##"<line x1="{xx:.1}" y1="{mt}" x2="{xx:.1}" y2="{:.1}" stroke="#f0f0f0"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            mt + ph,
            mt + ph + 18.0,
            t
        );
        t += x_step;
    }
    let _ = writeln!(
        s,
        r##"<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>"##
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">simulated time (s)</text>"#,
        ml + pw / 2.0,
        h - 14.0
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(18 {:.1}) rotate(-90)" text-anchor="middle">device pages in use</text>"#,
        mt + ph / 2.0
    );
    // Device capacity.
    let yc = y(device_pages as f64);
    let _ = writeln!(
        s,
        r##"<line x1="{ml}" y1="{yc:.1}" x2="{:.1}" y2="{yc:.1}" stroke="#888" stroke-dasharray="6 4"/><text x="{:.1}" y="{:.1}" text-anchor="end" fill="#666">device capacity ({device_pages} pages)</text>"##,
        ml + pw,
        ml + pw - 6.0,
        yc - 5.0
    );
    let series = [
        (0usize, "#d62728", "2", "", "no sharing"),
        (1, "#1f77b4", "3", "", "kvshare"),
        (2, "#2ca02c", "1.5", "5 4", "ideal"),
    ];
    for &(k, color, width, dash, _) in &series {
        let mut path = String::new();
        for (i, p) in pts.iter().enumerate() {
            let _ = write!(
                path,
                "{}{:.1},{:.1}",
                if i == 0 { "M" } else { " L" },
                x(p.0),
                y(p.1[k] as f64)
            );
        }
        let dash_attr = if dash.is_empty() {
            String::new()
        } else {
            format!(r#" stroke-dasharray="{dash}""#)
        };
        let _ = writeln!(
            s,
            r#"<path d="{path}" fill="none" stroke="{color}" stroke-width="{width}"{dash_attr}/>"#
        );
    }
    // Legend.
    for (n, &(_, color, width, dash, name)) in series.iter().enumerate() {
        let lx = ml + 14.0 + 130.0 * n as f64;
        let ly = mt + 16.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="{width}" stroke-dasharray="{}"/><text x="{}" y="{}">{name}</text>"#,
            lx + 28.0,
            if dash.is_empty() { "none" } else { dash },
            lx + 34.0,
            ly + 4.0
        );
    }
    s.push_str("</svg>\n");
    s
}

/// One line of [`plot_curves`].
#[derive(Debug, Clone, PartialEq)]
pub struct Curve {
    /// Legend text.
    pub name: String,
    /// Stroke colour.
    pub color: &'static str,
    /// SVG dash pattern (`""`: solid).
    pub dash: &'static str,
    /// `(x, y)` points, x ascending and positive.
    pub points: Vec<(f64, f64)>,
}

/// Curves of `y` against `x` on a logarithmic x axis (a marker at each point), with their
/// legend.
pub fn plot_curves(title: &str, x_label: &str, y_label: &str, curves: &[Curve]) -> String {
    let (w, h) = (960.0, 480.0);
    let (ml, mr, mt, mb) = (72.0, 200.0, 48.0, 56.0);
    let (pw, ph) = (w - ml - mr, h - mt - mb);
    let xs = curves.iter().flat_map(|c| c.points.iter().map(|p| p.0));
    let (x_lo, x_hi) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    let (x_lo, x_hi) = if x_lo > x_hi {
        (1.0, 10.0)
    } else if x_lo == x_hi {
        (x_lo / 2.0, x_hi * 2.0)
    } else {
        (x_lo, x_hi)
    };
    let (l_lo, l_hi) = (x_lo.max(1e-9).log10(), x_hi.max(1e-9).log10());
    let y_data = curves
        .iter()
        .flat_map(|c| c.points.iter().map(|p| p.1))
        .fold(0.0f64, f64::max)
        .max(1e-9);
    let y_step = nice_step(y_data, 6.0);
    let y_max = (y_data / y_step).ceil() * y_step;
    let x = |v: f64| ml + pw * (v.max(1e-9).log10() - l_lo) / (l_hi - l_lo).max(1e-9);
    let y = |v: f64| mt + ph * (1.0 - v / y_max);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="24" text-anchor="middle" font-size="15">{}</text>"#,
        ml + pw / 2.0,
        esc(title)
    );
    let mut v = 0.0;
    while v <= y_max + 1e-9 {
        let yy = y(v);
        let _ = writeln!(
            s,
            r##"<line x1="{ml}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#e5e5e5"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            ml + pw,
            ml - 6.0,
            yy + 4.0,
            (v * 100.0).round() / 100.0
        );
        v += y_step;
    }
    // Ticks at 1, 2 and 5 times the powers of ten in range.
    let mut decade = 10f64.powf(l_lo.floor());
    while decade <= x_hi * 1.0001 {
        for m in [1.0, 2.0, 5.0] {
            let t = decade * m;
            if t < x_lo * 0.9999 || t > x_hi * 1.0001 {
                continue;
            }
            let xx = x(t);
            let _ = writeln!(
                s,
                r##"<line x1="{xx:.1}" y1="{mt}" x2="{xx:.1}" y2="{:.1}" stroke="#f0f0f0"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                mt + ph,
                mt + ph + 18.0,
                t
            );
        }
        decade *= 10.0;
    }
    let _ = writeln!(
        s,
        r##"<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>"##
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        ml + pw / 2.0,
        h - 14.0,
        esc(x_label)
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(18 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
        mt + ph / 2.0,
        esc(y_label)
    );
    for (n, c) in curves.iter().enumerate() {
        let mut path = String::new();
        for (i, p) in c.points.iter().enumerate() {
            let _ = write!(
                path,
                "{}{:.1},{:.1}",
                if i == 0 { "M" } else { " L" },
                x(p.0),
                y(p.1)
            );
        }
        let dash = if c.dash.is_empty() {
            String::new()
        } else {
            format!(r#" stroke-dasharray="{}""#, c.dash)
        };
        let _ = writeln!(
            s,
            r#"<path d="{path}" fill="none" stroke="{}" stroke-width="2"{dash}/>"#,
            c.color
        );
        for p in &c.points {
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{}"/>"#,
                x(p.0),
                y(p.1),
                c.color
            );
        }
        let (lx, ly) = (ml + pw + 16.0, mt + 16.0 + 20.0 * n as f64);
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{}" stroke-width="2" stroke-dasharray="{}"/><text x="{}" y="{}">{}</text>"#,
            lx + 28.0,
            c.color,
            if c.dash.is_empty() { "none" } else { c.dash },
            lx + 34.0,
            ly + 4.0,
            esc(&c.name)
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plot_has_three_series_and_keeps_peaks() {
        let samples: Vec<StepPages> = (0..5000)
            .map(|i| StepPages {
                step: i,
                time_ms: i as f64 * 20.0,
                kvshare: if i == 2500 { 900 } else { 10 },
                no_sharing: 50,
                ideal: 10,
                cached: 0,
                running: 1,
            })
            .collect();
        let d = downsample(&samples, 1200);
        assert!(d.len() <= 1200);
        assert_eq!(d.iter().map(|p| p.1[1]).max(), Some(900));
        let svg = plot(&samples, "a <b>", 1000);
        assert_eq!(svg.matches("<path ").count(), 3);
        assert!(svg.contains("a &lt;b&gt;"));
        assert!(svg.ends_with("</svg>\n"));
        assert_eq!(nice_step(100.0, 10.0), 10.0);
        let c = |name: &str, pts: Vec<(f64, f64)>| Curve {
            name: name.into(),
            color: "#000",
            dash: "",
            points: pts,
        };
        let curves = plot_curves(
            "hits",
            "device pages",
            "%",
            &[
                c("lru", vec![(100.0, 10.0), (1000.0, 40.0)]),
                c("a<b", vec![(100.0, 20.0), (1000.0, 45.0)]),
            ],
        );
        assert_eq!(curves.matches("<path ").count(), 2);
        assert_eq!(curves.matches("<circle ").count(), 4);
        assert!(curves.contains("a&lt;b") && curves.ends_with("</svg>\n"));
        assert_eq!(nice_step(1234.0, 6.0), 200.0);
    }
}
