//! Xen's C libraries, loaded when `--xen` is used: libxencall (hypercalls through
//! /dev/xen/privcmd with hypercall-safe buffers), libxenforeignmemory (mapping the
//! guest's frames), libxenstore (domain names). All three have stable ABIs (sonames
//! .1, .1 and .4), unlike libxenctrl, whose structs change with every Xen release:
//! glass builds the few domctls it needs itself (see `abi`).
//!
//! Loaded at run time (libloading), not linked: glass builds and runs where Xen is
//! absent, and only `glass record --xen` needs them. Why an FFI of our own: the Rust
//! crates for Xen found are GPL-3.0 or target newer Xen.

use std::ffi::{c_char, c_int, c_uint, c_void, CString};

use libloading::Library;

type XencallOpen = unsafe extern "C" fn(*mut c_void, c_uint) -> *mut c_void;
type XencallClose = unsafe extern "C" fn(*mut c_void) -> c_int;
type XencallAllocBuffer = unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void;
type XencallFreeBuffer = unsafe extern "C" fn(*mut c_void, *mut c_void);
type Xencall1 = unsafe extern "C" fn(*mut c_void, c_uint, u64) -> c_int;
type Xencall2 = unsafe extern "C" fn(*mut c_void, c_uint, u64, u64) -> c_int;
type FmemOpen = unsafe extern "C" fn(*mut c_void, c_uint) -> *mut c_void;
type FmemClose = unsafe extern "C" fn(*mut c_void) -> c_int;
type FmemMap =
    unsafe extern "C" fn(*mut c_void, u32, c_int, usize, *const u64, *mut c_int) -> *mut c_void;
type FmemUnmap = unsafe extern "C" fn(*mut c_void, *mut c_void, usize) -> c_int;
type XsOpen = unsafe extern "C" fn(u64) -> *mut c_void;
type XsClose = unsafe extern "C" fn(*mut c_void);
type XsDirectory =
    unsafe extern "C" fn(*mut c_void, u32, *const c_char, *mut c_uint) -> *mut *mut c_char;
type XsRead = unsafe extern "C" fn(*mut c_void, u32, *const c_char, *mut c_uint) -> *mut c_void;

/// libxentoollog's logger (`struct xentoollog_logger`): three callbacks. Without one,
/// libxencall and libxenforeignmemory print their own error lines on stderr, and glass
/// says what went wrong in one line itself.
#[repr(C)]
pub struct Logger {
    vmessage:
        unsafe extern "C" fn(*mut Logger, c_int, c_int, *const c_char, *const c_char, *mut c_void),
    progress: unsafe extern "C" fn(*mut Logger, *const c_char, *const c_char, c_int, u64, u64),
    destroy: unsafe extern "C" fn(*mut Logger),
}

unsafe extern "C" fn quiet_message(
    _: *mut Logger,
    _: c_int,
    _: c_int,
    _: *const c_char,
    _: *const c_char,
    _: *mut c_void,
) {
}

unsafe extern "C" fn quiet_progress(
    _: *mut Logger,
    _: *const c_char,
    _: *const c_char,
    _: c_int,
    _: u64,
    _: u64,
) {
}

unsafe extern "C" fn quiet_destroy(_: *mut Logger) {}

/// A logger that says nothing (the libraries only read it; it lives for the program).
pub fn quiet_logger() -> *mut c_void {
    static QUIET: Logger = Logger {
        vmessage: quiet_message,
        progress: quiet_progress,
        destroy: quiet_destroy,
    };
    &QUIET as *const Logger as *mut c_void
}

/// The library files, by soname.
pub const XENCALL: &str = "libxencall.so.1";
pub const XENFOREIGNMEMORY: &str = "libxenforeignmemory.so.1";
pub const XENSTORE: &str = "libxenstore.so.4";

pub struct XenLibs {
    _libs: [Library; 3],
    pub xencall_open: XencallOpen,
    pub xencall_close: XencallClose,
    pub xencall_alloc_buffer: XencallAllocBuffer,
    pub xencall_free_buffer: XencallFreeBuffer,
    pub xencall1: Xencall1,
    pub xencall2: Xencall2,
    pub fmem_open: FmemOpen,
    pub fmem_close: FmemClose,
    pub fmem_map: FmemMap,
    pub fmem_unmap: FmemUnmap,
    xs_open: XsOpen,
    xs_close: XsClose,
    xs_directory: XsDirectory,
    xs_read: XsRead,
}

impl XenLibs {
    /// Loads the three libraries; the error names the first one missing.
    pub fn load() -> Result<XenLibs, String> {
        let open = |name: &str| {
            // SAFETY: these libraries run no initialisers with preconditions.
            unsafe { Library::new(name) }.map_err(|_| name.to_string())
        };
        let call = open(XENCALL)?;
        let fmem = open(XENFOREIGNMEMORY)?;
        let store = open(XENSTORE)?;
        fn get<T: Copy>(lib: &Library, name: &str) -> Result<T, String> {
            // SAFETY: each symbol is declared above with its C prototype.
            unsafe { lib.get::<T>(name.as_bytes()) }
                .map(|symbol| *symbol)
                .map_err(|_| format!("{name} (in Xen's libraries)"))
        }
        Ok(XenLibs {
            xencall_open: get(&call, "xencall_open")?,
            xencall_close: get(&call, "xencall_close")?,
            xencall_alloc_buffer: get(&call, "xencall_alloc_buffer")?,
            xencall_free_buffer: get(&call, "xencall_free_buffer")?,
            xencall1: get(&call, "xencall1")?,
            xencall2: get(&call, "xencall2")?,
            fmem_open: get(&fmem, "xenforeignmemory_open")?,
            fmem_close: get(&fmem, "xenforeignmemory_close")?,
            fmem_map: get(&fmem, "xenforeignmemory_map")?,
            fmem_unmap: get(&fmem, "xenforeignmemory_unmap")?,
            xs_open: get(&store, "xs_open")?,
            xs_close: get(&store, "xs_close")?,
            xs_directory: get(&store, "xs_directory")?,
            xs_read: get(&store, "xs_read")?,
            _libs: [call, fmem, store],
        })
    }

    /// The domains xenstore names: `(domid, name)` for every `/local/domain/N/name`.
    /// None when xenstore cannot be reached.
    pub fn domain_names(&self) -> Option<Vec<(u32, String)>> {
        // SAFETY: xs_open(0) opens the default connection or returns null.
        let handle = unsafe { (self.xs_open)(0) };
        if handle.is_null() {
            return None;
        }
        let mut names = Vec::new();
        let mut count: c_uint = 0;
        let root = CString::new("/local/domain").unwrap();
        // SAFETY: a valid handle and path; the result is one malloc'd block (freed below).
        let entries = unsafe { (self.xs_directory)(handle, 0, root.as_ptr(), &mut count) };
        if !entries.is_null() {
            for i in 0..count as usize {
                // SAFETY: xs_directory returned `count` C strings.
                let entry = unsafe { std::ffi::CStr::from_ptr(*entries.add(i)) };
                let Ok(domid) = entry.to_string_lossy().parse::<u32>() else {
                    continue;
                };
                let path = CString::new(format!("/local/domain/{domid}/name")).unwrap();
                let mut len: c_uint = 0;
                // SAFETY: as above; the value is malloc'd and freed here.
                let value = unsafe { (self.xs_read)(handle, 0, path.as_ptr(), &mut len) };
                if value.is_null() {
                    continue;
                }
                // SAFETY: xs_read returned `len` bytes.
                let bytes = unsafe { std::slice::from_raw_parts(value as *const u8, len as usize) };
                names.push((domid, String::from_utf8_lossy(bytes).into_owned()));
                // SAFETY: malloc'd by libxenstore.
                unsafe { libc::free(value) };
            }
            // SAFETY: malloc'd by libxenstore.
            unsafe { libc::free(entries.cast()) };
        }
        // SAFETY: the handle opened above.
        unsafe { (self.xs_close)(handle) };
        Some(names)
    }
}
