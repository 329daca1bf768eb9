//! `lazytrain plot`: loss and eval curves of a run as a PNG.
//!
//! Lines and axes are drawn with plotters' bitmap backend; text is drawn
//! with a bundled DejaVu Sans through `ab_glyph`, so no system font or
//! fontconfig is needed.

use crate::{Error, Result};
use ab_glyph::{Font, FontRef, PxScale, ScaleFont};
use plotters::prelude::*;
use serde_json::Value;
use std::path::Path;

const FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");
const WIDTH: u32 = 900;
const HEIGHT: u32 = 540;
const MARGIN: (i32, i32, i32, i32) = (60, 30, 80, 70); // top, right, left, bottom

/// The curves of a run: `(step, training loss)` and `(step, eval loss)`.
#[derive(Debug)]
pub struct Curves {
    /// Training loss per logged step.
    pub train: Vec<(f64, f64)>,
    /// Eval loss per evaluation.
    pub eval: Vec<(f64, f64)>,
}

/// Read the curves from a run folder's `trainer_state.json` (or, for a run
/// still in progress, `logs/log.jsonl`). A damaged `trainer_state.json`
/// beside a readable log is noted and the log plotted.
pub fn read_curves(run: &Path) -> Result<Curves> {
    let state_path = run.join("trainer_state.json");
    let entries = match read_log_history(&state_path) {
        Ok(Some(entries)) => entries,
        Ok(None) => read_log_lines(run)?,
        Err(damaged) => match read_log_lines(run) {
            Ok(entries) => {
                eprintln!("note: {damaged}; plotting logs/log.jsonl instead");
                entries
            }
            Err(_) => return Err(Error::Input(damaged)),
        },
    };
    let series = |key: &str| -> Vec<(f64, f64)> {
        entries.iter().filter_map(|e| Some((e.get("step")?.as_f64()?, e.get(key)?.as_f64()?))).collect()
    };
    let curves = Curves { train: series("loss"), eval: series("eval_loss") };
    if curves.train.is_empty() && curves.eval.is_empty() {
        return Err(Error::Input(format!("{} has no logged losses yet", run.display())));
    }
    Ok(curves)
}

/// The `log_history` of a `trainer_state.json`; `None` when there is no
/// such file, the file and what is wrong with it when it cannot be read.
fn read_log_history(path: &Path) -> std::result::Result<Option<Vec<Value>>, String> {
    let text = match std::fs::read_to_string(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
        Ok(text) => text,
    };
    let state: Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e} (is the file damaged?)", path.display()))?;
    Ok(Some(state["log_history"].as_array().cloned().unwrap_or_default()))
}

/// The entries of a run's `logs/log.jsonl` (lines that are not JSON, such
/// as a last line cut short by a kill, are skipped); an error names the file
/// when it is missing or none of its lines is an entry.
fn read_log_lines(run: &Path) -> Result<Vec<Value>> {
    let log = run.join("logs/log.jsonl");
    let bytes = std::fs::read(&log).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::Input(format!(
            "{} has neither trainer_state.json nor logs/log.jsonl; is it a training run?",
            run.display()
        )),
        _ => Error::Input(format!("{}: {e}", log.display())),
    })?;
    let text = String::from_utf8_lossy(&bytes);
    let entries: Vec<Value> = text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let lines = text.lines().filter(|l| !l.trim().is_empty()).count();
    if entries.is_empty() && lines > 0 {
        return Err(Error::Input(format!(
            "{}: none of its {lines} lines is a JSON log entry; is the file damaged?",
            log.display()
        )));
    }
    Ok(entries)
}

fn draw_text(buf: &mut [u8], font: &FontRef, text: &str, size: f32, (x, y): (f32, f32), color: [u8; 3]) {
    let scaled = font.as_scaled(PxScale::from(size));
    let mut caret = x;
    for ch in text.chars() {
        let glyph = scaled.scaled_glyph(ch);
        let advance = scaled.h_advance(glyph.id);
        let positioned = ab_glyph::Glyph { position: ab_glyph::point(caret, y + scaled.ascent()), ..glyph };
        if let Some(outline) = font.outline_glyph(positioned) {
            let bounds = outline.px_bounds();
            outline.draw(|gx, gy, coverage| {
                let (px, py) = (bounds.min.x as i64 + gx as i64, bounds.min.y as i64 + gy as i64);
                if (0..WIDTH as i64).contains(&px) && (0..HEIGHT as i64).contains(&py) {
                    let i = 3 * (py as usize * WIDTH as usize + px as usize);
                    for c in 0..3 {
                        let old = buf[i + c] as f32;
                        buf[i + c] = (old + (color[c] as f32 - old) * coverage.min(1.0)) as u8;
                    }
                }
            });
        }
        caret += advance;
    }
}

fn text_width(font: &FontRef, text: &str, size: f32) -> f32 {
    let scaled = font.as_scaled(PxScale::from(size));
    text.chars().map(|c| scaled.h_advance(scaled.glyph_id(c))).sum()
}

fn plot_error(e: impl std::fmt::Display) -> Error {
    Error::Input(format!("drawing the plot failed: {e}"))
}

/// Losses beyond this size are left off the axis (a diverged run's 1e308
/// would make the axis's span overflow to infinity); their points fall
/// outside the plot.
const LARGEST_PLOTTED_LOSS: f64 = 1e300;

/// The loss axis's range: the data's, padded by 5 % (a single value gets
/// ±5 % of itself), never below 0 for non-negative losses.
fn loss_range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| v.abs() <= LARGEST_PLOTTED_LOSS)
        .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo > hi {
        return (0.0, 1.0);
    }
    let pad = if hi - lo > 1e-9 * hi.abs().max(1.0) { 0.05 * (hi - lo) } else { 0.05 * hi.abs().max(1e-3) };
    let bottom = if lo >= 0.0 { (lo - pad).max(0.0) } else { lo - pad };
    (bottom, hi + pad)
}

/// Draw the curves into an RGB buffer of `WIDTH x HEIGHT`. A series of one
/// point is drawn as a marker; the legend lists only the series drawn.
pub fn render(curves: &Curves, title: &str) -> Result<Vec<u8>> {
    let mut buf = vec![255u8; (WIDTH * HEIGHT * 3) as usize];
    let all = curves.train.iter().chain(&curves.eval);
    let max_step = all.clone().map(|p| p.0).fold(1.0f64, f64::max);
    let (min_loss, max_loss) = loss_range(all.map(|p| p.1));
    let (top, right, left, bottom) = MARGIN;
    let (x0, y0, x1, y1) = (left, top, WIDTH as i32 - right, HEIGHT as i32 - bottom);
    {
        let root = BitMapBackend::with_buffer(&mut buf, (WIDTH, HEIGHT)).into_drawing_area();
        let area = root.margin(top as u32, bottom as u32, left as u32, right as u32);
        let mut chart =
            ChartBuilder::on(&area).build_cartesian_2d(0f64..max_step, min_loss..max_loss).map_err(plot_error)?;
        // Grid lines at the same fifths the text labels mark.
        let grid = RGBColor(225, 225, 225);
        for i in 0..=5 {
            let x = max_step * i as f64 / 5.0;
            let y = min_loss + (max_loss - min_loss) * i as f64 / 5.0;
            chart.draw_series(LineSeries::new([(x, min_loss), (x, max_loss)], grid)).map_err(plot_error)?;
            chart.draw_series(LineSeries::new([(0.0, y), (max_step, y)], grid)).map_err(plot_error)?;
        }
        chart
            .draw_series(LineSeries::new([(0.0, max_loss), (0.0, min_loss), (max_step, min_loss)], BLACK))
            .map_err(plot_error)?;
        chart.draw_series(LineSeries::new(curves.train.iter().copied(), BLUE.stroke_width(2))).map_err(plot_error)?;
        if curves.train.len() == 1 {
            chart.draw_series(curves.train.iter().map(|&p| Circle::new(p, 4, BLUE.filled()))).map_err(plot_error)?;
        }
        chart.draw_series(LineSeries::new(curves.eval.iter().copied(), RED.stroke_width(2))).map_err(plot_error)?;
        chart.draw_series(curves.eval.iter().map(|&p| Circle::new(p, 4, RED.filled()))).map_err(plot_error)?;
        root.present().map_err(plot_error)?;
    }
    let font = FontRef::try_from_slice(FONT).map_err(plot_error)?;
    let dark = [40, 40, 40];
    draw_text(&mut buf, &font, title, 22.0, (x0 as f32, 15.0), dark);
    for i in 0..=5 {
        let step = max_step * i as f64 / 5.0;
        let x = x0 as f32 + (x1 - x0) as f32 * i as f32 / 5.0;
        let label = format!("{step:.0}");
        draw_text(&mut buf, &font, &label, 14.0, (x - text_width(&font, &label, 14.0) / 2.0, y1 as f32 + 8.0), dark);
        let loss = min_loss + (max_loss - min_loss) * i as f64 / 5.0;
        let y = y1 as f32 - (y1 - y0) as f32 * i as f32 / 5.0;
        let label = format!("{loss:.3}");
        draw_text(&mut buf, &font, &label, 14.0, (x0 as f32 - 10.0 - text_width(&font, &label, 14.0), y - 9.0), dark);
    }
    draw_text(&mut buf, &font, "step", 16.0, ((x0 + x1) as f32 / 2.0 - 15.0, y1 as f32 + 35.0), dark);
    draw_text(&mut buf, &font, "loss", 16.0, (8.0, (y0 + y1) as f32 / 2.0 - 8.0), dark);
    let mut legend_y = y0 as f32 + 8.0;
    for (series, label, color) in
        [(&curves.train, "— training loss", [0, 0, 255]), (&curves.eval, "● eval loss", [255, 0, 0])]
    {
        if !series.is_empty() {
            draw_text(&mut buf, &font, label, 15.0, (x1 as f32 - 150.0, legend_y), color);
            legend_y += 22.0;
        }
    }
    Ok(buf)
}

/// Write an RGB buffer of `WIDTH x HEIGHT` as a PNG file.
pub fn write_png(path: &Path, rgb: &[u8]) -> Result<()> {
    let io = |e: &dyn std::fmt::Display| Error::Input(format!("{}: {e}", path.display()));
    let file = std::fs::File::create(path).map_err(|e| io(&e))?;
    let mut encoder = png::Encoder::new(std::io::BufWriter::new(file), WIDTH, HEIGHT);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header().map_err(|e| io(&e))?;
    writer.write_image_data(rgb).map_err(|e| io(&e))?;
    writer.finish().map_err(|e| io(&e))
}

/// Plot a run's curves into `output`.
pub fn plot_run(run: &Path, output: &Path) -> Result<()> {
    let curves = read_curves(run)?;
    let title = format!(
        "{} — loss",
        run.file_name().map_or_else(|| run.display().to_string(), |n| n.to_string_lossy().into_owned())
    );
    write_png(output, &render(&curves, &title)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows (y) of the pixels of one pure color.
    fn rows_of(buf: &[u8], color: [u8; 3]) -> Vec<usize> {
        let close = |p: &[u8]| p.iter().zip(color).all(|(&a, b)| (a as i32 - b as i32).abs() < 40);
        buf.chunks(3).enumerate().filter(|(_, p)| close(p)).map(|(i, _)| i / WIDTH as usize).collect()
    }

    #[test]
    fn a_single_point_is_a_marker_and_only_drawn_series_are_in_the_legend() {
        let curves = Curves { train: vec![(1.0, 4.2)], eval: Vec::new() };
        let buf = render(&curves, "one point").unwrap();
        assert!(rows_of(&buf, [0, 0, 255]).len() > 30, "the single training loss is drawn");
        assert!(rows_of(&buf, [255, 0, 0]).is_empty(), "no eval series, so no eval legend");
    }

    /// A damaged `trainer_state.json` or log is named; a damaged state beside
    /// a readable log plots the log.
    #[test]
    fn damaged_run_files_are_named() {
        let run = lazytrain_core::ScratchDir::new("plot-damaged").unwrap();
        std::fs::create_dir_all(run.join("logs")).unwrap();
        std::fs::write(run.join("logs/log.jsonl"), [0xffu8, 0xfe, b'\n', 0x80, b'x']).unwrap();
        let err = read_curves(&run).unwrap_err().to_string();
        assert!(err.contains("log.jsonl: none of its 2 lines is a JSON log entry"), "{err}");
        std::fs::write(run.join("trainer_state.json"), "").unwrap();
        let err = read_curves(&run).unwrap_err().to_string();
        assert!(err.contains("trainer_state.json: EOF while parsing") && err.contains("damaged"), "{err}");
        std::fs::write(run.join("logs/log.jsonl"), "{\"step\": 1, \"loss\": 2.5}\n{\"step\": 2, \"lo").unwrap();
        assert_eq!(read_curves(&run).unwrap().train, [(1.0, 2.5)], "the log, its cut last line skipped");
    }

    #[test]
    fn the_loss_axis_fits_the_data() {
        assert_eq!(loss_range([2.0, 4.0].into_iter()), (1.9, 4.1));
        let (lo, hi) = loss_range([5.0].into_iter());
        assert!((lo - 4.75).abs() < 1e-12 && (hi - 5.25).abs() < 1e-12);
        // Non-finite and absurd losses stay off the axis.
        assert_eq!(loss_range([2.0, 4.0, f64::NAN, 1e308, -1e308].into_iter()), (1.9, 4.1));
        // Losses between 10.0 and 10.2 fill the plot's height, not its top sliver.
        let curves = Curves { train: (0..20).map(|i| (i as f64, 10.2 - 0.01 * i as f64)).collect(), eval: Vec::new() };
        let rows = rows_of(&render(&curves, "narrow").unwrap(), [0, 0, 255]);
        let curve: Vec<usize> = rows.into_iter().filter(|&y| y > MARGIN.0 as usize + 40).collect();
        let span = curve.iter().max().unwrap() - curve.iter().min().unwrap();
        assert!(span > (HEIGHT as usize - 200) / 2, "the curve spans {span} pixel rows");
    }
}
