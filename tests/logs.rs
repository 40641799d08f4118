//! A host's log callback (`kvt_set_log_callback`, through the C ABI) receives the storage
//! client's retry messages during a fault, and loses nothing it asked for. Its own binary:
//! the callback is process-wide.

#[macro_use]
mod support;

use std::ffi::{c_char, c_void, CStr};
use std::sync::Mutex;

use kvtier::logs::LogLevel;
use kvtier_core::{JobKind, Status, Tier};
use serde_json::json;
use support::proxy::{Fault, Proxy};
use support::*;

/// (level, target, message) of every record the callback received.
static RECORDS: Mutex<Vec<(LogLevel, String, String)>> = Mutex::new(Vec::new());

unsafe extern "C" fn collect(
    userdata: *mut c_void,
    level: LogLevel,
    target: *const c_char,
    message: *const c_char,
) {
    assert_eq!(
        userdata as usize, 0x5eed,
        "the callback gets the host's pointer back"
    );
    // SAFETY: the library passes NUL-terminated strings valid for the call.
    let (target, message) = unsafe { (CStr::from_ptr(target), CStr::from_ptr(message)) };
    let record = (
        level,
        target.to_string_lossy().into_owned(),
        message.to_string_lossy().into_owned(),
    );
    RECORDS.lock().unwrap().push(record);
}

#[test]
fn retry_messages_reach_the_hosts_callback() {
    let srv = Server::s3s_fs();
    let bucket = srv.new_bucket();
    let proxy = Proxy::start(srv.port());
    // The first PUT of every object is answered 503 SlowDown: the client retries it. On the
    // general client: a direct PUT's 503 would go to it as a fallback, not as its retry.
    let seen = Mutex::new(std::collections::HashSet::new());
    proxy.set_rule(move |r| {
        if r.method == "PUT"
            && r.path.ends_with(".bin")
            && seen.lock().unwrap().insert(r.path.clone())
        {
            Fault::Status(503)
        } else {
            Fault::Pass
        }
    });
    let store = with(
        with(
            srv.store_json(&bucket),
            "endpoint_override",
            json!(proxy.endpoint()),
        ),
        "direct_http",
        json!(false),
    );
    // SAFETY: a function with the callback's signature, and a token pointer it only compares.
    let status = unsafe {
        kvtier::kvt_set_log_callback(Some(collect), 0x5eed as *mut c_void, LogLevel::Info as i32)
    };
    assert_eq!(status, Status::Ok);

    let tier = Tier::from_json(&tier_json(store, json!({}))).unwrap();
    let mut pool = Pool::new(8, 64 * 1024);
    pool.fill_random(3);
    pool.register(&tier);
    tier.submit(JobKind::Store, 1, &[0, 1, 2], keys(&[0, 1, 2]))
        .unwrap();
    let r = wait_all(&tier, 1).remove(&1).unwrap();
    assert_eq!(r.status, Status::Ok, "{}", r.message);
    // Each refused PUT was sent once more, and the counter says so (in metrics too).
    let refused = proxy.stats().faults("status");
    assert_eq!(tier.stats().retries, refused, "{:?}", proxy.stats());
    let metrics = tier.metrics();
    assert!(
        metrics.contains(&format!("kvtier_retries_total {refused}")),
        "{metrics}"
    );
    drop(tier);

    // SAFETY: NULL restores the default; afterwards `collect` is never called again.
    assert_eq!(
        unsafe { kvtier::kvt_set_log_callback(None, std::ptr::null_mut(), 0) },
        Status::Ok
    );
    let records = RECORDS.lock().unwrap().clone();
    assert!(proxy.stats().faults("status") >= 3, "{:?}", proxy.stats());
    let retries: Vec<_> = records
        .iter()
        .filter(|(_, target, _)| target.starts_with("object_store"))
        .collect();
    assert!(
        retries
            .iter()
            .any(|(level, _, message)| *level == LogLevel::Info && message.contains("503")),
        "no retry message of the storage client among {records:#?}"
    );
    assert!(
        records.iter().all(|(level, _, _)| *level <= LogLevel::Info),
        "a record above max_level: {records:#?}"
    );
    assert!(
        records
            .iter()
            .any(|(_, target, m)| target.starts_with("kvtier") && m.contains("tier ready")),
        "{records:#?}"
    );
    for (_, _, message) in &records {
        assert!(
            !message.contains(srv.secret_key.as_str()),
            "a secret in a record: {message}"
        );
    }
    // An invalid level is refused with a status, not a crash.
    // SAFETY: as above.
    assert_eq!(
        unsafe { kvtier::kvt_set_log_callback(None, std::ptr::null_mut(), 9) },
        Status::InvalidArgument
    );
}
