//! A tier driven through the exported C functions, as a C host drives it: created from its
//! JSON, a leaked pool registered, jobs submitted and their results awaited on the event
//! fd with a bound, freed on drop.

use std::ffi::{CStr, CString};
use std::time::{Duration, Instant};

use kvtier::abi::kvt_eviction_report;
use kvtier::{kvt_kv_event, kvt_result, kvt_tier};
use kvtier_core::{JobKind, Status};

/// How long a job may take on a busy machine.
const JOB_BOUND: Duration = Duration::from_secs(60);

/// `kvt_last_error` of this thread.
pub fn last_error() -> String {
    // SAFETY: never NULL, valid until the next kvt_ call on this thread.
    unsafe { CStr::from_ptr(kvtier::kvt_last_error()) }
        .to_string_lossy()
        .into_owned()
}

pub struct CTier {
    pub ptr: *mut kvt_tier,
}

impl CTier {
    /// `kvt_tier_new(config)`, which must succeed.
    pub fn new(config: &str) -> CTier {
        let config = CString::new(config).unwrap();
        let mut ptr = std::ptr::null_mut();
        // SAFETY: a NUL-terminated configuration and an out-pointer.
        let status = unsafe { kvtier::kvt_tier_new(config.as_ptr(), &mut ptr) };
        assert_eq!(status, Status::Ok, "{}", last_error());
        CTier { ptr }
    }

    /// Registers `blocks` blocks of `block_bytes` random bytes (`seed`), never freed, so
    /// they outlive the tier.
    pub fn register_pool(&self, blocks: u64, block_bytes: usize, seed: u64) -> &'static [u8] {
        let pool = super::random_bytes(blocks as usize * block_bytes, seed).leak();
        // SAFETY: a live tier, and memory valid for the rest of the process.
        let status = unsafe {
            kvtier::kvt_tier_register_memory(self.ptr, pool.as_mut_ptr(), blocks, block_bytes)
        };
        assert_eq!(status, Status::Ok, "{}", last_error());
        pool
    }

    /// Submits a store or load of blocks `ids` under `keys` (back to back, one length) and
    /// waits for its result: its status and message.
    pub fn run(&self, kind: JobKind, job: u64, ids: &[u64], keys: &[Vec<u8>]) -> (Status, String) {
        assert_eq!(ids.len(), keys.len());
        let key_len = keys[0].len();
        let flat: Vec<u8> = keys.concat();
        let submit = match kind {
            JobKind::Store => kvtier::kvt_tier_submit_store,
            JobKind::Load => kvtier::kvt_tier_submit_load,
        };
        // SAFETY: a live tier; ids and keys valid for the call.
        let submitted = unsafe {
            submit(
                self.ptr,
                job,
                ids.as_ptr(),
                flat.as_ptr(),
                key_len,
                ids.len(),
            )
        };
        assert_eq!(submitted, Status::Ok, "{}", last_error());
        self.result_of(job)
    }

    /// Waits (bounded) for job `job`'s result, the only one expected.
    pub fn result_of(&self, job: u64) -> (Status, String) {
        let deadline = Instant::now() + JOB_BOUND;
        loop {
            // SAFETY: a live tier; its event fd, and one pollfd.
            let mut ready = libc::pollfd {
                fd: unsafe { kvtier::kvt_tier_event_fd(self.ptr) },
                events: libc::POLLIN,
                revents: 0,
            };
            unsafe { libc::poll(&mut ready, 1, 100) };
            let mut result = std::mem::MaybeUninit::<kvt_result>::zeroed();
            let mut count = 0;
            // SAFETY: room for one result.
            let polled =
                unsafe { kvtier::kvt_tier_poll(self.ptr, result.as_mut_ptr(), 1, &mut count) };
            assert_eq!(polled, Status::Ok, "{}", last_error());
            if count == 1 {
                // SAFETY: written by the poll; its message valid until the next poll.
                let result = unsafe { result.assume_init() };
                assert_eq!(result.job_id, job);
                let message = unsafe { CStr::from_ptr(result.message) };
                return (result.status, message.to_string_lossy().into_owned());
            }
            assert!(
                Instant::now() < deadline,
                "job {job}: no result within {JOB_BOUND:?}"
            );
        }
    }

    /// `kvt_tier_clear`: its status and report.
    pub fn clear(&self) -> (Status, kvt_eviction_report) {
        // SAFETY: a live tier and a report to write.
        unsafe {
            let mut report = std::mem::zeroed::<kvt_eviction_report>();
            let status = kvtier::kvt_tier_clear(self.ptr, &mut report);
            (status, report)
        }
    }

    /// Every KV event waiting: (removed, keys).
    pub fn take_kv_events(&self) -> Vec<(bool, Vec<Vec<u8>>)> {
        let mut taken = Vec::new();
        loop {
            // SAFETY: room for 16 events; their keys read before the next call.
            unsafe {
                let mut events: [std::mem::MaybeUninit<kvt_kv_event>; 16] =
                    [const { std::mem::MaybeUninit::zeroed() }; 16];
                let mut count = 0;
                let status = kvtier::kvt_tier_take_kv_events(
                    self.ptr,
                    events.as_mut_ptr().cast(),
                    events.len(),
                    &mut count,
                );
                assert_eq!(status, Status::Ok, "{}", last_error());
                for event in &events[..count] {
                    let event = event.assume_init_ref();
                    let keys = std::slice::from_raw_parts(
                        event.event.keys,
                        event.event.key_len * event.event.num_keys,
                    );
                    let keys = keys.chunks(event.event.key_len).map(<[u8]>::to_vec);
                    taken.push((event.removed, keys.collect()));
                }
                if count < events.len() {
                    return taken;
                }
            }
        }
    }
}

impl Drop for CTier {
    fn drop(&mut self) {
        // SAFETY: a live tier, freed once.
        unsafe { kvtier::kvt_tier_free(self.ptr) };
    }
}
