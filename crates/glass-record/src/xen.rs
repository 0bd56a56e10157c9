//! `glass record --xen DOMID|NAME`: a Xen guest sampled from dom0 through the hypervisor
//! (`glass_target::xen::XenBackend`) by the same loop as every VM guest (`guest::run`).
//!
//! Order matters for the domain's safety: the domain is found and checked, then the
//! guardian starts (with the pause mark it watches), and only then does the first
//! pause happen; every way out of the loop unpauses before the guardian is told `done`.

use glass_format::Backend;
use glass_target::stop_mark::StopMark;
use glass_target::xen::{Hypervisor, XenBackend};
use glass_target::TargetError;
use nix::sys::signalfd::SignalFd;

use super::guest::{GuestTarget, Vmm};
use super::guest_image::GuestImage;
use super::recorder::Recorder as Sink;
use super::{finish, Outcome};
use crate::{Recorded, Result};

pub fn record(
    mut sink: Sink,
    stop_signals: &SignalFd,
) -> std::result::Result<Result<Recorded>, TargetError> {
    let args = sink.args;
    let spec = args.xen.clone().unwrap_or_default();
    let symbols = args.symbols.clone().unwrap_or_default();
    let mut image = GuestImage::load(&symbols)?;
    image.check_arch(&symbols, glass_target::xen::GUEST_ARCH)?;
    let mut os = super::guest_os::guest_os_for(&symbols, &image, None, None)?;
    let mut hypervisor = Hypervisor::open()?;
    let (info, name) = hypervisor.find(&spec)?;
    let mark = StopMark::create().map_err(TargetError::Io)?;
    let guardian = super::guardian::Guardian::start_xen(info.domid, &mark, sink.stop_bound)?;
    let mut backend = XenBackend::new(hypervisor, info, Some(mark))?;
    if let Some(cpu) = args.sampler_cpu {
        super::pin_to_cpu(cpu).map_err(TargetError::Io)?;
    }
    sink.notes.figure(&format!(
        "Xen domain {name} (id {}): {} ({} online), {}",
        info.domid,
        glass_format::count(info.max_vcpu_id + 1, "vCPU"),
        info.online_vcpus,
        info.kind()
    ));
    let target = GuestTarget {
        backend: &mut backend,
        image: &mut image,
        symbols: &symbols,
        vmm: &mut Vmm::Stub,
        // The backend marks its own pauses.
        stop_mark: None,
        os: os.as_deref_mut(),
    };
    let outcome = match super::guest::run(&mut sink, target, stop_signals) {
        Ok(outcome) => outcome,
        Err(error) => Outcome::WriteFailed(error),
    };
    // Whatever ended the recording, the domain runs on.
    if let Err(error) = glass_target::guest::GuestBackend::detach(&mut backend) {
        sink.notes.warn(&format!("{error}"));
    }
    drop(backend);
    guardian.done();
    Ok(finish(sink, outcome, None, Backend::Xen))
}
