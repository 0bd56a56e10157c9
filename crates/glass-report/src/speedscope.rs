//! `--format speedscope`: speedscope's file format
//! (https://www.speedscope.app/file-format-schema.json). A sampled recording becomes one
//! "sampled" profile per thread (stacks root first, in time order, each weighted by the
//! time it stands for); a `glass trace` recording one "evented" profile per thread, an
//! open and a close event per call.

use std::collections::HashMap;
use std::io::Write;

use serde_json::{json, Value};

use crate::model::{FrameIndex, FrameKind, Model, Source, ThreadRow, Unit};
use crate::{Exporter, ReportError};

pub struct Speedscope {
    /// The name speedscope shows for the file.
    pub title: String,
}

fn unit(model: &Model) -> &'static str {
    match (model.source, model.unit) {
        (_, Unit::Cycles) => "none",
        // Without a rate, a sample stands for one sample.
        (Source::Samples, _) if model.period == 0 => "none",
        _ => "nanoseconds",
    }
}

fn profile_name(model: &Model, thread: &ThreadRow) -> String {
    format!(
        "{} {} ({})",
        model.string(thread.process),
        model.string(thread.name),
        thread.tid
    )
}

impl Exporter for Speedscope {
    fn write(&self, model: &Model, out: &mut dyn Write) -> Result<(), ReportError> {
        // speedscope's frames: one per function name and file (the module), so that
        // its tables show each function once however many addresses it was seen at.
        let mut frames: Vec<Value> = Vec::new();
        let mut by_name: HashMap<(u32, Option<u32>), usize> = HashMap::new();
        let frame_of: Vec<usize> = model
            .frames
            .iter()
            .map(|row| {
                let file = match (row.kind, row.module) {
                    (FrameKind::Code, Some(module)) => Some(model.modules[module as usize].path),
                    _ => None,
                };
                *by_name.entry((row.function, file)).or_insert_with(|| {
                    let mut frame = json!({ "name": model.string(row.function) });
                    if let Some(file) = file {
                        frame["file"] = json!(model.string(file));
                    }
                    frames.push(frame);
                    frames.len() - 1
                })
            })
            .collect();
        let mut profiles = Vec::new();
        let mut path: Vec<FrameIndex> = Vec::new();
        for thread in &model.threads {
            let start = thread.samples.first().map_or(0, |s| s.time);
            let profile = match model.source {
                Source::Samples => {
                    let mut samples = Vec::with_capacity(thread.samples.len());
                    let mut weights = Vec::with_capacity(thread.samples.len());
                    let mut total = 0u64;
                    for sample in &thread.samples {
                        model.stack_frames(sample.stack, &mut path);
                        samples.push(json!(path
                            .iter()
                            .map(|&f| frame_of[f as usize])
                            .collect::<Vec<_>>()));
                        let weight = if model.period == 0 {
                            sample.weight
                        } else {
                            sample.cost
                        };
                        weights.push(weight);
                        total += weight;
                    }
                    json!({
                        "type": "sampled",
                        "name": profile_name(model, thread),
                        "unit": unit(model),
                        "startValue": 0,
                        "endValue": total,
                        "samples": samples,
                        "weights": weights,
                    })
                }
                Source::Calls => {
                    let events: Vec<Value> = thread
                        .events
                        .iter()
                        .map(|e| {
                            json!({
                                "type": if e.open { "O" } else { "C" },
                                "frame": frame_of[e.frame as usize],
                                "at": e.time,
                            })
                        })
                        .collect();
                    json!({
                        "type": "evented",
                        "name": profile_name(model, thread),
                        "unit": unit(model),
                        "startValue": thread.events.first().map_or(start, |e| e.time),
                        "endValue": thread.events.last().map_or(start, |e| e.time),
                        "events": events,
                    })
                }
            };
            profiles.push(profile);
        }
        let active = model
            .threads
            .iter()
            .enumerate()
            .max_by_key(|(i, t)| (t.samples.len(), std::cmp::Reverse(*i)))
            .map_or(0, |(i, _)| i);
        let file = json!({
            "$schema": "https://www.speedscope.app/file-format-schema.json",
            "name": self.title,
            "exporter": concat!("glass ", env!("CARGO_PKG_VERSION")),
            "activeProfileIndex": active,
            "shared": { "frames": frames },
            "profiles": profiles,
        });
        serde_json::to_writer(&mut *out, &file)?;
        writeln!(out)?;
        Ok(())
    }
}
