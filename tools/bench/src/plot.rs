// SPDX-License-Identifier: Apache-2.0
//! PNG charts for `--plot DIR`: RX latency vs TX weight (seed001), the
//! device/raw ratio vs frame size (limit) and buffers per frame (seed000/002).
//!
//! plotters draws text with ab_glyph, which needs a TrueType font at run
//! time; DejaVu Sans (Debian's `fonts-dejavu-core`) is looked up in the usual
//! places.

use std::path::Path;

use anyhow::{anyhow, Context, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use serde_json::Value;

const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];

fn register_font() -> Result<()> {
    let path = FONTS
        .iter()
        .find(|p| Path::new(p).exists())
        .ok_or_else(|| anyhow!("no DejaVuSans.ttf found (apt-get install fonts-dejavu-core)"))?;
    let bytes: &'static [u8] = Box::leak(std::fs::read(path)?.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| anyhow!("{path} is not a usable font"))
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("plotting: {e:?}")
}

/// Writes every chart the data in `out` allows into `dir`.
pub fn charts(out: &Value, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    register_font()?;
    if out["seed001"]["rows"].is_array() {
        latency(out, &dir.join("seed001_latency_vs_weight.png"))?;
    }
    if out["limit"]["rows"].is_array() {
        ratios(out, &dir.join("limit_ratio_vs_size.png"))?;
    }
    Ok(())
}

fn latency(out: &Value, path: &Path) -> Result<()> {
    let rows = out["seed001"]["rows"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let names: Vec<String> = rows
        .iter()
        .map(|r| {
            r["config"]
                .as_str()
                .unwrap_or("?")
                .replace("weight_", "w")
                .replace("unweighted", "off")
                .replace("bytes_only", "bytes")
                .replace("_t", "/")
        })
        .collect();
    let get = |k: &str| -> Vec<f64> {
        rows.iter()
            .map(|r| r[k].as_f64().unwrap_or(0.0).max(1.0))
            .collect()
    };
    let (p99, avg, max) = (get("p99_us"), get("avg_us"), get("max_us"));
    let top = max.iter().cloned().fold(10.0, f64::max) * 2.0;
    let n = names.len() as i32;
    let root = canvas(path, (1300, 560))?;
    let mut chart = chart_on(
        &root,
        "RX latency under a 1-byte TX flood vs TX weight and pass time budget",
        70,
    )
    .build_cartesian_2d(0..n - 1, (1.0..top).log_scale())
    .map_err(err)?;
    chart
        .configure_mesh()
        .x_labels(names.len())
        .x_label_formatter(&|i| names.get(*i as usize).cloned().unwrap_or_default())
        .x_desc(
            "wN: TX packet weight N; wN/T: and a T µs pass time budget; off: unweighted; \
             bytes: the 0x80000-byte weight alone; default: NetConfig::default()",
        )
        .y_desc("latency, µs (log)")
        .draw()
        .map_err(err)?;
    for (vals, color, label) in [
        (&p99, RED, "p99"),
        (&avg, BLUE, "avg"),
        (&max, RGBColor(150, 150, 150), "max"),
    ] {
        let pts: Vec<(i32, f64)> = vals
            .iter()
            .enumerate()
            .map(|(i, v)| (i as i32, *v))
            .collect();
        draw_marked_line(&mut chart, pts, color, label)?;
    }
    draw_legend(&mut chart, SeriesLabelPosition::MiddleRight)?;
    root.present().map_err(err)?;
    Ok(())
}

fn ratios(out: &Value, path: &Path) -> Result<()> {
    let sizes = [64u64, 1514, 65536];
    let lim = &out["limit"];
    let series = |k: &str| -> Vec<(i32, f64)> {
        sizes
            .iter()
            .enumerate()
            .filter_map(|(i, s)| lim[format!("{k}_{s}")].as_f64().map(|v| (i as i32, v)))
            .collect()
    };
    let all: Vec<_> = [
        ("RX minivmm/raw", "rx_ratio", RED),
        ("TX minivmm/raw", "tx_ratio", BLUE),
        ("RX bounce/raw", "rx_bounce_ratio", RGBColor(240, 150, 150)),
        ("TX bounce/raw", "tx_bounce_ratio", RGBColor(140, 140, 240)),
        ("RX CPU raw/minivmm", "rx_cpu_ratio", RGBColor(160, 60, 0)),
        ("TX CPU raw/minivmm", "tx_cpu_ratio", RGBColor(0, 130, 60)),
    ]
    .into_iter()
    .map(|(label, key, color)| (label, series(key), color))
    .collect();
    let top = all
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.1))
        .fold(1.2, f64::max);
    let labels = ["64 B", "1514 B", "64 KiB"];
    let root = canvas(path, (900, 540))?;
    let mut chart = chart_on(
        &root,
        "minivmm vs the raw TAP loop: frames/s and CPU-per-frame ratios",
        60,
    )
    .build_cartesian_2d(0..2, 0.0..top)
    .map_err(err)?;
    chart
        .configure_mesh()
        .x_labels(3)
        .x_label_formatter(&|i| {
            labels
                .get(*i as usize)
                .map(|s| s.to_string())
                .unwrap_or_default()
        })
        .x_desc("frame size")
        .y_desc("ratio (1.0 = raw TAP)")
        .draw()
        .map_err(err)?;
    chart
        .draw_series(LineSeries::new(
            vec![(0, 0.9), (2, 0.9)],
            BLACK.stroke_width(1),
        ))
        .map_err(err)?
        .label("target 0.90")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
    for (label, pts, color) in all {
        draw_marked_line(&mut chart, pts, color, label)?;
    }
    draw_legend(&mut chart, SeriesLabelPosition::LowerRight)?;
    root.present().map_err(err)?;
    Ok(())
}

/// A white PNG canvas of `size` pixels, written to `path` on `present`.
fn canvas(path: &Path, size: (u32, u32)) -> Result<DrawingArea<BitMapBackend<'_>, Shift>> {
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    Ok(root)
}

/// A chart on `root` in the layout of every chart here: `caption` on top, the same margins
/// and x label area, and `y_label_width` pixels for the y axis's labels.
fn chart_on<'a, 'b>(
    root: &'a DrawingArea<BitMapBackend<'b>, Shift>,
    caption: &str,
    y_label_width: u32,
) -> ChartBuilder<'a, 'b, BitMapBackend<'b>> {
    let mut builder = ChartBuilder::on(root);
    builder
        .caption(caption, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(y_label_width);
    builder
}

/// Draws the legend of every labelled series at `position`, boxed on white.
fn draw_legend<'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, BitMapBackend<'a>, CT>,
    position: SeriesLabelPosition,
) -> Result<()> {
    chart
        .configure_series_labels()
        .position(position)
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()
        .map_err(err)
}

/// Draws `pts` as a line with a dot on each measured point, under `label`
/// in the legend: the style of every series in these charts (the dots show
/// where the figures are, the line only joins them).
fn draw_marked_line<'a, X, Y>(
    chart: &mut ChartContext<'a, BitMapBackend<'a>, Cartesian2d<X, Y>>,
    pts: Vec<(i32, f64)>,
    color: RGBColor,
    label: &str,
) -> Result<()>
where
    X: Ranged<ValueType = i32>,
    Y: Ranged<ValueType = f64>,
{
    chart
        .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
        .map_err(err)?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    chart
        .draw_series(pts.into_iter().map(|p| Circle::new(p, 4, color.filled())))
        .map_err(err)?;
    Ok(())
}
