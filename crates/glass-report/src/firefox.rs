//! `--format firefox`: the Firefox Profiler's processed profile JSON (open it at
//! profiler.firefox.com, "Load a profile from file"), made with the
//! `fxprof-processed-profile` crate: one process per program, one timeline per thread
//! with every sample at its time, frames named (the profile is symbolized) and in
//! categories: User, Kernel, Guest (subcategories halted and firmware), JIT, Other.

use std::collections::HashMap;
use std::io::Write;

use fxprof_processed_profile::{
    CategoryColor, CategoryPairHandle, CpuDelta, Frame, FrameFlags, FrameInfo,
    Profile as FxProfile, ReferenceTimestamp, SamplingInterval, Timestamp,
};

use crate::model::{Category, FrameIndex, Model, StackIndex};
use crate::{Exporter, ReportError};

pub struct Firefox {
    /// The product name the profiler shows.
    pub title: String,
}

impl Exporter for Firefox {
    fn write(&self, model: &Model, out: &mut dyn Write) -> Result<(), ReportError> {
        crate::Format::Firefox.check(model.source)?;
        let interval = if model.period > 0 {
            SamplingInterval::from_nanos(model.period)
        } else {
            SamplingInterval::from_millis(1)
        };
        let reference =
            ReferenceTimestamp::from_millis_since_unix_epoch(model.start_unix_ns as f64 / 1e6);
        let mut profile = FxProfile::new(&self.title, reference, interval);
        profile.set_os_name("Linux");
        profile.set_symbolicated(true);
        let user: CategoryPairHandle = profile.add_category("User", CategoryColor::Yellow).into();
        let kernel: CategoryPairHandle =
            profile.add_category("Kernel", CategoryColor::Orange).into();
        let guest_category = profile.add_category("Guest", CategoryColor::Blue);
        let guest: CategoryPairHandle = guest_category.into();
        let halted = profile.add_subcategory(guest_category, "halted");
        let firmware = profile.add_subcategory(guest_category, "firmware");
        let jit: CategoryPairHandle = profile.add_category("JIT", CategoryColor::Green).into();
        let other: CategoryPairHandle = profile.add_category("glass", CategoryColor::Gray).into();
        let off_cpu: CategoryPairHandle = profile
            .add_category("Off-CPU", CategoryColor::LightBlue)
            .into();
        let category = |c: Category| match c {
            Category::User => user,
            Category::Kernel => kernel,
            Category::Guest => guest,
            Category::GuestHalted => halted,
            Category::GuestFirmware => firmware,
            Category::Jit => jit,
            Category::Other => other,
            Category::OffCpu => off_cpu,
        };

        let mut processes = HashMap::new();
        let mut path: Vec<FrameIndex> = Vec::new();
        for thread in &model.threads {
            let start =
                Timestamp::from_nanos_since_reference(thread.samples.first().map_or(0, |s| s.time));
            let end = thread.samples.last().map_or(0, |s| s.time);
            let process = *processes
                .entry((thread.pid, thread.process))
                .or_insert_with(|| {
                    profile.add_process(model.string(thread.process), thread.pid, start)
                });
            let handle = profile.add_thread(process, thread.tid, start, thread.tid == thread.pid);
            profile.set_thread_name(handle, model.string(thread.name));
            profile.set_thread_end_time(handle, Timestamp::from_nanos_since_reference(end));
            let mut stacks: HashMap<
                Option<StackIndex>,
                Option<fxprof_processed_profile::StackHandle>,
            > = HashMap::new();
            for sample in &thread.samples {
                let stack = match stacks.get(&sample.stack) {
                    Some(&stack) => stack,
                    None => {
                        model.stack_frames(sample.stack, &mut path);
                        let infos: Vec<FrameInfo> = path
                            .iter()
                            .map(|&frame| {
                                let row = model.frames[frame as usize];
                                FrameInfo {
                                    frame: Frame::Label(
                                        profile.intern_string(model.string(row.function)),
                                    ),
                                    category_pair: category(row.category),
                                    flags: FrameFlags::empty(),
                                }
                            })
                            .collect();
                        let stack = profile.intern_stack_frames(handle, infos.into_iter());
                        stacks.insert(sample.stack, stack);
                        stack
                    }
                };
                profile.add_sample(
                    handle,
                    Timestamp::from_nanos_since_reference(sample.time),
                    stack,
                    CpuDelta::from_nanos(sample.cost),
                    i32::try_from(sample.weight).unwrap_or(i32::MAX),
                );
            }
        }
        serde_json::to_writer(&mut *out, &profile)?;
        writeln!(out)?;
        Ok(())
    }
}
