//! A tier's end: shutdown (jobs finished or cancelled within the grace period) and free.

use super::*;

/// Shuts the tier down, in order:
/// 1. new submissions fail with KVT_STATUS_SHUT_DOWN (and still yield their result);
/// 2. transfers not yet started are cancelled and reported as KVT_STATUS_CANCELLED;
/// 3. transfers in progress are waited for, up to `shutdown_timeout_ms` of the config
///    (the grace period), then abandoned (reported as KVT_STATUS_CANCELLED);
/// 4. the library stops writing the host pool: a write into it in progress (a copy of a
///    block already read, a decryption) finishes, and none starts afterwards;
/// 5. the I/O threads are stopped, and waited for up to 1 s; a thread blocked in the
///    kernel (a local-store read of a hung NFS mount or a failing disk) or in a keyring
///    command is not waited for: the command is killed, and the thread is left to end
///    when the kernel lets it go.
///
/// Returns within the grace period plus about 1 s, whatever a store read or a keyring
/// command is blocked in. Every job still running then yields exactly one result,
/// KVT_STATUS_CANCELLED. A read abandoned this way lands in a buffer of the library's,
/// never in the host pool: when this call returns, the library no longer reads or writes
/// the host pool and regions, and the caller may reuse or free them. Not promised: a page
/// fault of the caller's own memory that hangs (a pool backed by a hung file mapping, or
/// memory paging in from a hung swap device) delays the write in progress at step 4 for
/// as long as it hangs; no library can bound that.
///
/// Afterwards `kvt_tier_poll`, `kvt_tier_take_events`, `kvt_tier_stats`,
/// `kvt_tier_event_fd`, `kvt_tier_jobs_in_flight`, `kvt_tier_shutdown` and `kvt_tier_free`
/// keep working; the submit calls return KVT_STATUS_SHUT_DOWN and still yield their result;
/// every other call returns KVT_STATUS_SHUT_DOWN. Idempotent. Blocks. Must not run
/// concurrently with other calls on the same tier.
#[no_mangle]
pub unsafe extern "C" fn kvt_tier_shutdown(tier: *mut kvt_tier) -> Status {
    // SAFETY: `tier` is NULL or a live handle (the header's precondition).
    unsafe {
        guard_tier("kvt_tier_shutdown", tier, Access::Collect, |handle| {
            handle.tier.shutdown();
            Ok(())
        })
    }
}

/// Shuts the tier down (as `kvt_tier_shutdown`: within the grace period plus about 1 s,
/// even while a store read or a keyring command hangs) and releases the handle and
/// everything it owns, including unpolled results and the event fd. When it returns the
/// library no longer touches the host pool or regions (a read abandoned in the kernel
/// lands in the library's own buffer, if ever). `tier` must not be used afterwards and must
/// not be freed twice (undefined behaviour). NULL is a no-op. Blocks. Must not run
/// concurrently with other calls on the same tier.
///
/// In a fork() child of the process that created the tier, it returns at once: the
/// handle is retired without joining the tier's threads (they exist only in the parent)
/// and without touching locks, sockets or registrations shared with the parent; only the
/// child's copy of the event fd is closed, the rest of the tier's memory stays allocated
/// in the child.
#[no_mangle]
pub unsafe extern "C" fn kvt_tier_free(tier: *mut kvt_tier) {
    if tier.is_null() {
        set_last_error(None);
        return;
    }
    // SAFETY: non-NULL, and a handle from kvt_tier_new not yet freed (the header's
    // precondition): its memory is readable.
    let forked = unsafe {
        std::ptr::read_volatile(std::ptr::addr_of!((*tier).magic)) == TIER_MAGIC
            && (*tier).pid != current_pid()
    };
    if forked {
        // A forked child: the tier's threads exist only in the parent, its locks may be
        // held by them, and its sockets and epoll registrations are shared with the
        // parent. Releasing any of that would hang or disturb the parent, so the handle
        // is retired without running its destructor: only the child's copy of the event
        // fd is closed.
        // SAFETY: a live handle (as above); the child owns its copy of the event fd, which
        // nothing else in the child uses once the handle is retired.
        unsafe {
            std::ptr::write_volatile(std::ptr::addr_of_mut!((*tier).magic), 0);
            libc::close((*tier).tier.ready_fd());
        }
        set_last_error(None);
        return;
    }
    // SAFETY: non-NULL and a handle from kvt_tier_new (the header's precondition).
    let (live, _) =
        unsafe { guard_tier_or("kvt_tier_free", tier, Access::Collect, false, |_| Ok(true)) };
    if !live {
        return;
    }
    // Separate steps: a panic while the handle is being released must not mark the
    // (by then freed) handle failed.
    let stopped = guard("kvt_tier_free", || {
        // SAFETY: check_tier found a live handle, and the caller runs nothing else on it.
        unsafe { (*tier).tier.shutdown() };
        Ok(())
    });
    let released = guard("kvt_tier_free", || {
        // SAFETY: the handle came from Box::into_raw in kvt_tier_new and is released once:
        // the tag is cleared first, so a second free is refused as a best effort.
        unsafe {
            std::ptr::write_volatile(std::ptr::addr_of_mut!((*tier).magic), 0);
            drop(Box::from_raw(tier));
        }
        Ok(())
    });
    if stopped != Status::Ok && released == Status::Ok {
        set_last_error(Some(Error::new(
            stopped,
            "kvt_tier_free: the shutdown panicked; the handle was released",
        )));
    }
}
