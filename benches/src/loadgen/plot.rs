//! `--plot FILE.svg`: every server's latency percentile curve on one chart, the
//! percentile axis log-scaled as HdrHistogram plots do (0%, 90%, 99%, 99.9%, ... evenly
//! spaced), drawn with plotters' SVG backend.

use std::path::Path;

use plotters::prelude::*;

/// Colours of the curves, in the servers' order (then again).
const COLOURS: [RGBColor; 6] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
];

/// The x of percentile `q` (a fraction): 1 / (1 - q), so each further 9 is one decade.
fn x_of(q: f64, x_max: f64) -> f64 {
    if q >= 1.0 {
        x_max
    } else {
        (1.0 / (1.0 - q)).min(x_max)
    }
}

/// The label of x: the percentile it stands for.
fn label(x: f64) -> String {
    let p = 100.0 * (1.0 - 1.0 / x);
    let s = format!("{p:.5}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s}%")
}

/// Draws `curves` ((percentile fraction, latency µs) points per server) into `path`.
pub(crate) fn draw(
    path: &Path,
    curves: &[(&str, &[(f64, f64)])],
    title: &str,
) -> Result<(), String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    // The axis reaches the decade of the finest percentile measured (at least 99.9%),
    // where the max is drawn.
    let finest = curves
        .iter()
        .flat_map(|(_, pts)| pts.iter())
        .filter(|(q, _)| *q < 1.0)
        .map(|(q, _)| 1.0 / (1.0 - q))
        .fold(1000.0f64, f64::max);
    let x_max = 10f64.powf(finest.log10().ceil()).min(1e7);
    let values = || curves.iter().flat_map(|(_, pts)| pts.iter().map(|p| p.1));
    let lo = values().fold(f64::INFINITY, f64::min);
    let hi = values().fold(0.0f64, f64::max);
    let (lo, hi) = if lo.is_finite() && hi > 0.0 {
        (
            10f64.powf((lo.max(0.1)).log10().floor()),
            10f64.powf(hi.log10().ceil()),
        )
    } else {
        (1.0, 1000.0)
    };
    let hi = if hi <= lo { lo * 10.0 } else { hi };

    let root = SVGBackend::new(path, (960, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d((1f64..x_max).log_scale(), (lo..hi).log_scale())
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("latency (µs)")
        .x_label_formatter(&|x| label(*x))
        .y_label_formatter(&|y| format!("{y}"))
        .draw()
        .map_err(|x| e(&x))?;
    for (i, (name, pts)) in curves.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        chart
            .draw_series(LineSeries::new(
                pts.iter().map(|&(q, v)| (x_of(q, x_max), v.max(lo))),
                colour.stroke_width(2),
            ))
            .map_err(|x| e(&x))?
            .label(*name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], colour.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}
