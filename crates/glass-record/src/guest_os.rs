//! Which guest OS the guest loop is told of: the loop knows vCPUs, stops and stacks
//! only, and asks whatever knows the guest's memory through glass-target's `GuestOs`.
//! Today that is a Linux kernel (glass-linux-guest): named by `--guest-btf`, or likely
//! whenever the image is a symbol table (a kallsyms or System.map: its slide and, on
//! x86-64, its ORC tables are looked for).

use std::path::Path;

use glass_linux_guest::LinuxGuest;
use glass_target::guest_os::GuestOs;
use glass_target::TargetError;

use super::guest_image::GuestImage;

/// The guest OS for an image read from `symbols`, with `btf` (`--guest-btf`) and `root`
/// (`--guest-root`); None when nothing is known of it (an ELF image without BTF: a
/// unikernel, a demo guest). Every failure is one line of bad input, said before the VM
/// is touched.
pub(crate) fn guest_os_for(
    symbols: &Path,
    image: &GuestImage,
    btf: Option<&Path>,
    root: Option<&Path>,
) -> Result<Option<Box<dyn GuestOs>>, TargetError> {
    let symbol_table = image.arch.is_none();
    if btf.is_none() && !symbol_table {
        return Ok(None);
    }
    let linux = LinuxGuest::load(symbols, symbol_table, btf, root)?;
    Ok(Some(Box::new(linux)))
}
