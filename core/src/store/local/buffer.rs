//! A file I/O thread's own buffer, which the local store's reads and writes go through
//! (see `LocalFiles::read` and `fill`): made at the thread's first use, kept for the next.

use super::{DIRECT_ALIGN, IO_BUFFER};
use crate::error::{Error, Result, Status};

thread_local! {
    /// This thread's read buffer, made at its first read and kept for the next ones.
    static IO_BUFFER_OF_THREAD: std::cell::RefCell<Option<AlignedBuffer>> =
        const { std::cell::RefCell::new(None) };
}

/// Runs `read` with this thread's read buffer (IO_BUFFER bytes, aligned for O_DIRECT).
/// A thread abandoned at shutdown while the kernel holds its read keeps the buffer, and
/// frees it when the thread ends.
pub(super) fn with_io_buffer<R>(read: impl FnOnce(&mut [u8]) -> Result<R>) -> Result<R> {
    IO_BUFFER_OF_THREAD.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(AlignedBuffer::new(IO_BUFFER).ok_or_else(|| {
                Error::new(Status::Io, "cannot allocate the local store's read buffer")
            })?);
        }
        read(slot.as_mut().expect("made above").bytes())
    })
}

/// Heap memory aligned for O_DIRECT, owned by one thread.
struct AlignedBuffer {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
}

impl AlignedBuffer {
    fn new(len: usize) -> Option<AlignedBuffer> {
        let layout = std::alloc::Layout::from_size_align(len, DIRECT_ALIGN).ok()?;
        // SAFETY: `layout` has a non-zero size (IO_BUFFER).
        let ptr = std::ptr::NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })?;
        Some(AlignedBuffer { ptr, layout })
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: a live allocation of `layout.size()` initialised bytes, borrowed uniquely
        // through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for AlignedBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}
