//! Unit tests of the C ABI's argument checks and conversions.

use super::*;

fn memory_tier() -> *mut kvt_tier {
    let mut tier = std::ptr::null_mut();
    let status =
        // SAFETY: a NUL-terminated literal and a valid out-pointer.
        unsafe { kvt_tier_new(c"{\"store\":{\"type\":\"memory\"}}".as_ptr(), &mut tier) };
    assert_eq!(status, Status::Ok);
    tier
}

fn last_error() -> String {
    // SAFETY: kvt_last_error returns a NUL-terminated string owned by this thread, valid until its next call.
    unsafe { CStr::from_ptr(kvt_last_error()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn a_panic_marks_the_tier_failed_and_every_job_still_gets_its_result() {
    let tier = memory_tier();
    let mut pool = vec![0u8; 4096];
    let key = [7u8; KVT_DEFAULT_KEY_BYTES];
    let block = [0u64];
    // SAFETY: `tier` is live and `pool` is 4096 bytes that outlive the tier's jobs; the key and block arrays are live for each call.
    unsafe {
        assert_eq!(
            kvt_tier_register_memory(tier, pool.as_mut_ptr(), 1, 4096),
            Status::Ok
        );
        let status = guard_tier("test_call", tier, Access::Work, |_| panic!("deliberate"));
        assert_eq!(status, Status::Panic);
        let message = last_error();
        assert!(
            message.contains("test_call: deliberate") && message.contains("src/tests.rs"),
            "{message}"
        );
        // Work is refused: submits with their one result, other calls outright.
        assert_eq!(
            kvt_tier_submit_store(tier, 1, block.as_ptr(), key.as_ptr(), key.len(), 1),
            Status::Panic
        );
        let mut verdict = kvt_lookup_result::Retry;
        assert_eq!(
            kvt_tier_lookup(tier, 1, key.as_ptr(), key.len(), &mut verdict),
            Status::Panic
        );
        assert_eq!(kvt_tier_schedule_end(tier), Status::Panic);
        assert_eq!(kvt_tier_drain(tier, 0), Status::Panic);
        // Collecting still works.
        let mut results: [std::mem::MaybeUninit<kvt_result>; 4] =
            [const { std::mem::MaybeUninit::uninit() }; 4];
        let mut n = 9;
        assert_eq!(
            kvt_tier_poll(tier, results.as_mut_ptr() as *mut kvt_result, 4, &mut n),
            Status::Ok
        );
        assert_eq!(n, 1);
        let r = results[0].assume_init_read();
        assert_eq!((r.job_id, r.status, r.num_keys), (1, Status::Panic, 1));
        let mut stats = kvt_stats::default();
        assert_eq!(
            kvt_tier_stats(tier, &mut stats, std::mem::size_of::<kvt_stats>()),
            Status::Ok
        );
        assert_eq!(kvt_tier_shutdown(tier), Status::Ok);
        kvt_tier_free(tier);
    }
}

#[test]
fn panics_inside_calls_do_not_reach_the_previous_hook() {
    use std::sync::atomic::AtomicUsize;
    static PRINTED: AtomicUsize = AtomicUsize::new(0);
    // The hook in place before the library's: it counts the panics of this test's
    // threads that would have been printed.
    // (Set directly: tests share the process, so the library's one-time install may
    // already have happened.)
    boundary::install_panic_hook();
    let previous = std::panic::take_hook();
    std::panic::set_hook(boundary::silencing_hook(Box::new(move |info| {
        if std::thread::current()
            .name()
            .is_some_and(|n| n.starts_with("hook-test-"))
        {
            PRINTED.fetch_add(1, Ordering::SeqCst);
        } else {
            previous(info);
        }
    })));
    let inside = std::thread::Builder::new()
        .name("hook-test-inside".into())
        .spawn(|| guard("test_call", || panic!("inside a call")))
        .unwrap()
        .join()
        .unwrap();
    assert_eq!(inside, Status::Panic);
    assert_eq!(
        PRINTED.load(Ordering::SeqCst),
        0,
        "a panic inside a kvt_ call reached the host's hook"
    );
    let outside = std::thread::Builder::new()
        .name("hook-test-outside".into())
        .spawn(|| panic!("host's own"))
        .unwrap()
        .join();
    assert!(outside.is_err());
    assert_eq!(
        PRINTED.load(Ordering::SeqCst),
        1,
        "a panic outside the library must reach the host's hook"
    );
}

#[test]
fn every_status_has_a_string_and_round_trips() {
    for v in 0..21 {
        let s = crate::info::status_from_int(v).expect("contiguous codes");
        assert_eq!(s as c_int, v);
        // SAFETY: kvt_status_str returns a static NUL-terminated string for any code.
        let text = unsafe { CStr::from_ptr(kvt_status_str(v)) }
            .to_str()
            .unwrap();
        assert_eq!(text, s.as_str());
    }
    assert!(crate::info::status_from_int(22).is_none());
    assert_eq!(
        // SAFETY: kvt_status_str returns a static NUL-terminated string for any code.
        unsafe { CStr::from_ptr(kvt_status_str(-1)) }
            .to_str()
            .unwrap(),
        "unknown status"
    );
}
