//! The retry budget: how long one store operation may go on repeating its requests,
//! counted from its first attempt, whoever repeats them (`object_store`'s retry loop, the
//! direct path's fallback to it, kvtier's own repeats of refused uploads).
//!
//! `object_store` bounds its repeats of one request by a time from that request's first
//! attempt (`RetryConfig::retry_timeout`, set to the budget). An operation may send several
//! requests in a row: a direct attempt and then the general client's, a conditional PUT
//! repeated by kvtier after a cut connection, a multipart upload's parts. So that these
//! share one budget rather than each spending its own, an operation runs inside [`within`],
//! which sets its deadline for the task; the HTTP service (`http_options.rs`) makes a
//! failure it sees after that deadline final ([`BudgetSpent`]), so that no one repeats it.

use std::future::Future;
use std::time::{Duration, Instant};

use object_store::client::HttpErrorKind;

/// Existence checks answering lookups repeat for at most this long: a lookup keeps its
/// request waiting in the engine's scheduler, and past a couple of seconds recomputing
/// the block costs less than waiting for a store that does not answer.
pub(crate) const LOOKUP_RETRY_BUDGET: Duration = Duration::from_secs(2);

/// The start-up checks (the probe, and whether the store honours conditional PUTs and
/// checks uploads) repeat for at most this long: a tier that cannot reach its store
/// should say so promptly, with advice, rather than wait out an outage.
pub(crate) const START_UP_RETRY_BUDGET: Duration = Duration::from_secs(2);

/// Backoff before the first repeat, and the most any repeat waits: a server that comes
/// back is found within a second.
pub(crate) const FIRST_BACKOFF: Duration = Duration::from_millis(50);
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// How a store's requests are repeated: for `budget` from an operation's first attempt,
/// and at most `max_retries` times per request when a count is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RetryPolicy {
    pub(crate) budget: Duration,
    pub(crate) max_retries: Option<usize>,
}

impl RetryPolicy {
    /// No repeats (the local and memory stores, whose failures time does not mend).
    pub(crate) const NONE: RetryPolicy = RetryPolicy {
        budget: Duration::ZERO,
        max_retries: Some(0),
    };

    /// The count `object_store` is given: the configured one, else one no budget reaches
    /// (a repeat waits at least 50 ms; the budget is at most five minutes).
    pub(crate) fn object_store_max_retries(&self) -> usize {
        self.max_retries.unwrap_or(10_000)
    }

    /// Whether repeat number `attempt` (1-based) may be made under this policy in the
    /// operation under way (or one that started at `started`, outside any).
    pub(crate) fn allows(&self, attempt: usize, started: Instant) -> bool {
        self.max_retries.is_none_or(|most| attempt <= most)
            && remaining().unwrap_or_else(|| self.budget.saturating_sub(started.elapsed()))
                > Duration::ZERO
    }
}

tokio::task_local! {
    /// When the retry budget of the operation under way in this task runs out.
    static DEADLINE: Instant;
}

/// Runs one store operation with `budget` for its repeats. Inside an operation already
/// under way (an existence check a store makes for itself), the earlier deadline holds.
pub(crate) async fn within<F: Future>(budget: Duration, operation: F) -> F::Output {
    let mut deadline = Instant::now() + budget;
    if let Ok(outer) = DEADLINE.try_with(|d| *d) {
        deadline = deadline.min(outer);
    }
    DEADLINE.scope(deadline, operation).await
}

/// What is left of the budget of the operation under way; `None` outside one.
pub(crate) fn remaining() -> Option<Duration> {
    DEADLINE
        .try_with(|deadline| deadline.saturating_duration_since(Instant::now()))
        .ok()
}

/// Whether the operation under way has spent its budget (false outside one).
pub(crate) fn spent() -> bool {
    remaining() == Some(Duration::ZERO)
}

/// Backoff before repeat `attempt` (1-based): up to 50 ms doubling to 1 s, with full
/// jitter over its upper half, and never past what is left of the budget.
pub(crate) fn backoff(attempt: usize) -> Duration {
    let ceiling = (FIRST_BACKOFF.as_millis() as u64)
        .saturating_mul(1 << attempt.clamp(1, 16).saturating_sub(1))
        .min(MAX_BACKOFF.as_millis() as u64);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let jitter = u64::from(nanos) % (ceiling / 2 + 1);
    let wait = Duration::from_millis(ceiling / 2 + jitter);
    remaining().map_or(wait, |left| wait.min(left))
}

/// The failure of an attempt made after its operation's budget ran out, which would
/// otherwise be repeated: handed to `object_store` as a transport error of a kind it does
/// not repeat. `kind` is the transport failure's own (`None` for an error answer, whose
/// status and code the answer carries), by which the failure is classified.
#[derive(Debug)]
pub(crate) struct BudgetSpent {
    pub(crate) kind: Option<HttpErrorKind>,
    pub(crate) what: String,
    pub(crate) source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl std::fmt::Display for BudgetSpent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "retry budget spent; the last attempt: {}", self.what)
    }
}

impl std::error::Error for BudgetSpent {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_operation_shares_one_deadline_and_nested_ones_keep_it() {
        let within_of = |left: Option<Duration>, most: u64| {
            let left = left.expect("inside an operation");
            left <= Duration::from_secs(most) && left > Duration::from_secs(most) / 2
        };
        assert_eq!(remaining(), None);
        assert!(!spent());
        within(Duration::from_secs(2), async {
            assert!(within_of(remaining(), 2));
            within(Duration::from_secs(20), async {
                assert!(within_of(remaining(), 2), "the outer one holds");
            })
            .await;
            within(Duration::from_secs(1), async {
                assert!(within_of(remaining(), 1), "a shorter one holds");
            })
            .await;
        })
        .await;
        within(Duration::ZERO, async { assert!(spent()) }).await;
    }

    #[test]
    fn backoff_grows_to_a_second_and_policies_bound_repeats() {
        for attempt in 1..40 {
            let wait = backoff(attempt);
            assert!(wait <= MAX_BACKOFF, "{attempt}: {wait:?}");
            assert!(wait >= FIRST_BACKOFF / 2, "{attempt}: {wait:?}");
        }
        assert!(backoff(20) >= MAX_BACKOFF / 2);
        let started = Instant::now();
        let counted = RetryPolicy {
            budget: Duration::from_secs(60),
            max_retries: Some(2),
        };
        assert!(counted.allows(2, started) && !counted.allows(3, started));
        let timed = RetryPolicy {
            budget: Duration::from_secs(60),
            max_retries: None,
        };
        assert!(timed.allows(1000, started));
        assert!(!RetryPolicy::NONE.allows(1, started));
        let past = started - Duration::from_secs(61);
        assert!(
            !timed.allows(1, past),
            "the budget from the first attempt is spent"
        );
    }
}
