//! SVG plots next to the tables (`target/bench/*.svg`), drawn with plotters.

use std::path::{Path, PathBuf};

use plotters::coord::ranged1d::ValueFormatter;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

/// Where `cargo xtask bench` writes its plots: `target/bench/` in the repository.
pub fn out_dir() -> PathBuf {
    let dir = crate::repo_root().join("target/bench");
    let _ = std::fs::create_dir_all(&dir);
    dir
}

/// One line of a plot: its name and its (x, y) points.
pub type Series = (String, Vec<(f64, f64)>);

const COLORS: [RGBColor; 4] = [RED, BLUE, BLACK, GREEN];

/// A line plot of `series` with labelled axes; `log_x` for a logarithmic x axis.
pub fn lines(
    path: &Path,
    title: &str,
    labels: (&str, &str),
    series: &[Series],
    log_x: bool,
) -> Result<(), String> {
    let points = series.iter().flat_map(|(_, p)| p.iter());
    let (mut x0, mut x1, mut y1) = (f64::MAX, f64::MIN, 0.0f64);
    for &(x, y) in points {
        (x0, x1, y1) = (x0.min(x), x1.max(x), y1.max(y));
    }
    if x0 > x1 {
        return Err("nothing to plot".into());
    }
    if x0 == x1 {
        x1 = x0 + 1.0;
    }
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60);
    let y_range = 0.0..y1 * 1.1 + f64::EPSILON;
    if log_x {
        let mut chart = builder
            .build_cartesian_2d((x0.max(1e-3)..x1).log_scale(), y_range)
            .map_err(|e| e.to_string())?;
        draw_lines(&mut chart, labels, series)?;
    } else {
        let mut chart = builder
            .build_cartesian_2d(x0..x1, y_range)
            .map_err(|e| e.to_string())?;
        draw_lines(&mut chart, labels, series)?;
    }
    root.present().map_err(|e| e.to_string())
}

fn draw_lines<'a, X: Ranged<ValueType = f64> + ValueFormatter<f64>>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, RangedCoordf64>>,
    (x_label, y_label): (&str, &str),
    series: &[Series],
) -> Result<(), String> {
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, (name, points)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(|e| e.to_string())?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| e.to_string())
}

/// Write a plot and report where it went.
pub fn report(result: Result<(), String>, path: &Path) {
    match result {
        Ok(()) => println!("  plot: {}", path.display()),
        Err(e) => println!("  plot {} failed: {e}", path.display()),
    }
}
