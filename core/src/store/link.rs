//! The link to the store, as the tier's own requests measure it, and what follows from it:
//! whether a transfer goes as one request or as parts on connections of their own.
//!
//! A remote store caps what one connection moves and charges a round trip per request, so
//! a caller with a few jobs in flight leaves most of the link idle: its objects each crawl
//! down one connection. Parts (ranged GETs, multipart uploads) fill it. On a nearby store
//! the same parts only cost requests: there the hosts' CPUs are the limit, and more
//! connections share them. Which one a link is cannot be told from a threshold (a busy
//! machine on loopback moves a connection as slowly as a capped link does), so the tier
//! measures it:
//!
//! - **What it gets.** Every request of a transfer reports its bytes, how long it took
//!   (from the request to the last byte) and how many requests of its direction were in
//!   flight meanwhile, on average over its time. Its bytes per second times that count is what the link carried in
//!   total at the time; an average of it is kept per way of transferring ([`Mode`]).
//!   The round trip is the least time to a response head over recent GETs.
//! - **Probes.** Once one mode has been measured, the other is tried for a short probe (a
//!   few transfers, the first of them not measured: the link is still busy with the other
//!   mode's). Parts are kept when they carried at least [`BETTER`] times more than whole
//!   objects, else whole objects (fewer requests for the same). A capped link
//!   carries about as much per connection with four times the connections (four times the
//!   total); a CPU-bound one carries the same total or less. Probes repeat, ever more
//!   rarely while they confirm the mode in use, and soon again when what the link carries
//!   moves by half or doubles (the link changed).
//! - **How many parts.** As many as `max_inflight_transfers` leaves for each transfer in
//!   flight (at most 4 with 16 of the default 64 in flight), no load part under
//!   [`MIN_LOAD_PART`] and no store part under S3's smallest, 5 MiB (so an object under
//!   10 MiB is always stored as one PUT: S3 refuses smaller parts but the last), and only
//!   where they save a tenth of the transfer's expected time (its body at the measured rate
//!   of one connection, plus the round trip; a multipart upload costs two round trips more).
//!
//! Until a direction has been measured the rule of fixed parts applies (8 MiB loads and
//! 16 MiB stores, while a quarter of the lane or less is in flight), so a tier that moves
//! only a few objects behaves as before. An explicit `load_part_bytes`/`store_part_bytes`
//! keeps that rule with its size, unmeasured.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Smallest part of a load whose parts the link decides: smaller ranged GETs cost more in
/// requests than they save.
pub(crate) const MIN_LOAD_PART: usize = 256 << 10;
/// S3's smallest part of a multipart upload (all but the last).
pub(crate) const MIN_STORE_PART: usize = 5 << 20;
/// Parts of loads until the link is measured, and with `load_part_bytes` left out.
pub(crate) const COLD_LOAD_PART: usize = 8 << 20;
/// Parts of stores until the link is measured, and with `store_part_bytes` left out.
pub(crate) const COLD_STORE_PART: usize = 16 << 20;
/// How much more one mode must carry than the other to be switched to.
pub(crate) const BETTER: f64 = 1.25;
/// Measured requests of a mode before it counts.
const ENOUGH: u64 = 8;
/// Transfers between probes, at first and at most.
const FIRST_GAP: u64 = 64;
const LAST_GAP: u64 = 4096;
/// Round-trip samples the least of which is the round trip.
const RTT_WINDOW: usize = 32;
/// Requests smaller than this say little about a connection's rate.
const RATE_FLOOR: usize = 64 << 10;

/// Which way bytes go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Load = 0,
    Store = 1,
}

/// How a transfer goes: one request, or parts on connections of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Whole = 0,
    Split = 1,
}

/// What the engine's transfer lane looks like when a transfer starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lane {
    /// Transfers in flight, this one included.
    pub(crate) in_flight: usize,
    /// `max_inflight_transfers`.
    pub(crate) most: usize,
}

impl Lane {
    /// One transfer alone (the command line, tests).
    pub(crate) const ALONE: Lane = Lane {
        in_flight: 1,
        most: 1,
    };

    /// Whether a quarter of the lane or fewer are in flight (one alone always is): the
    /// rule of fixed parts.
    pub(crate) fn quarter_or_less(&self) -> bool {
        self.in_flight.saturating_mul(4) <= self.most.max(4)
    }

    /// Connections `max_inflight_transfers` leaves to each transfer in flight.
    fn share(&self) -> usize {
        (self.most / self.in_flight.max(1)).max(1)
    }
}

/// The parts of a transfer and what its requests report under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Bytes of each part (the last one: the rest); `None`: one request.
    pub(crate) part_len: Option<usize>,
    pub(crate) tag: Tag,
}

/// Under which mode and probe a request's measurement counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tag {
    direction: Direction,
    mode: Mode,
    epoch: u64,
    measured: bool,
}

/// What the link looks like now, and what the tier did on it (for tests and reports).
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct LinkReport {
    /// The least time to a response head over recent GETs.
    pub round_trip: Option<Duration>,
    pub load: DirectionReport,
    pub store: DirectionReport,
}

#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct DirectionReport {
    /// The mode in use; `None` until measured (the rule of fixed parts).
    pub chosen: Option<Mode>,
    /// Bytes per second the link carried in total, in each mode ([`Mode`] as index).
    pub carried: [Option<f64>; 2],
    /// Bytes per second of one request, over its whole time.
    pub connection_rate: Option<f64>,
    /// Transfers planned, and requests they sent (parts count one each).
    pub transfers: u64,
    pub requests: u64,
    /// Probes run.
    pub probes: u64,
}

/// An average that forgets, restarted at an epoch.
#[derive(Debug, Clone, Copy, Default)]
struct Average {
    value: f64,
    count: u64,
    since_epoch: u64,
}

impl Average {
    const WEIGHT: f64 = 0.1;

    fn add(&mut self, x: f64) {
        self.value = if self.count == 0 {
            x
        } else {
            self.value + Self::WEIGHT * (x - self.value)
        };
        self.count += 1;
    }

    fn get(&self) -> Option<f64> {
        (self.count > 0).then_some(self.value)
    }

    fn restart(&mut self, epoch: u64) {
        *self = Average {
            since_epoch: epoch,
            ..Default::default()
        };
    }
}

#[derive(Debug, Clone, Copy)]
struct Probe {
    mode: Mode,
    /// Transfers still to plan in it, and the first ones not measured.
    left: u64,
    unmeasured: u64,
    /// Whether every transfer has been planned; then it ends on enough measurements.
    planned: bool,
}

#[derive(Debug, Default)]
struct Side {
    chosen: Option<Mode>,
    probe: Option<Probe>,
    epoch: u64,
    carried: [Average; 2],
    /// Of one connection, over the body (the round trip taken off).
    body_rate: Average,
    request_rate: Average,
    since_decision: u64,
    gap: u64,
    decided_at: f64,
    /// Measured requests of the chosen mode since the last decision.
    measured_since: u64,
    transfers: u64,
    probes: u64,
}

#[derive(Debug, Default)]
struct State {
    rtts: Vec<Duration>,
    next_rtt: usize,
    sides: [Side; 2],
}

/// The link estimator of one store client.
#[derive(Debug, Default)]
pub(crate) struct Link {
    state: Mutex<State>,
    in_flight: [Mutex<Busy>; 2],
    sent: [AtomicU64; 2],
}

/// Requests of one direction in flight, and their count integrated over time (request
/// seconds): over a request's life its increase is the requests that were in flight beside
/// it, on average, times its time.
#[derive(Debug)]
struct Busy {
    count: usize,
    since: Instant,
    integral: f64,
}

impl Default for Busy {
    fn default() -> Self {
        Busy {
            count: 0,
            since: Instant::now(),
            integral: 0.0,
        }
    }
}

impl Busy {
    /// Adds `by` requests (or takes them off); returns the integral up to now.
    fn change(&mut self, by: isize) -> f64 {
        let now = Instant::now();
        self.integral += self.count as f64 * now.duration_since(self.since).as_secs_f64();
        self.since = now;
        self.count = self.count.saturating_add_signed(by);
        self.integral
    }
}

/// A request in flight, counted until dropped.
pub(crate) struct Request<'a> {
    link: &'a Link,
    tag: Tag,
    started: Instant,
    integral_at_start: f64,
    bytes: usize,
}

impl Request<'_> {
    /// The request completed with all its bytes: its measurement counts.
    pub(crate) fn done(self) {
        let took = self.started.elapsed();
        let integral = self.link.busy(self.tag.direction).change(0);
        let alongside = (integral - self.integral_at_start) / took.as_secs_f64().max(1e-9);
        self.link
            .record(self.tag, self.bytes, took, alongside.max(1.0));
    }
}

impl Drop for Request<'_> {
    fn drop(&mut self) {
        self.link.busy(self.tag.direction).change(-1);
    }
}

impl Link {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn busy(&self, direction: Direction) -> std::sync::MutexGuard<'_, Busy> {
        self.in_flight[direction as usize]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// A GET's time from its request to its response head.
    pub(crate) fn head_after(&self, took: Duration) {
        let mut state = self.state();
        if state.rtts.len() < RTT_WINDOW {
            state.rtts.push(took);
        } else {
            let at = state.next_rtt;
            state.rtts[at] = took;
        }
        state.next_rtt = (state.next_rtt + 1) % RTT_WINDOW;
    }

    /// Starts timing one request of `bytes` of a transfer planned under `tag`.
    pub(crate) fn request(&self, tag: Tag, bytes: usize) -> Request<'_> {
        self.sent[tag.direction as usize].fetch_add(1, Ordering::Relaxed);
        let integral_at_start = self.busy(tag.direction).change(1);
        Request {
            link: self,
            tag,
            started: Instant::now(),
            integral_at_start,
            bytes,
        }
    }

    fn record(&self, tag: Tag, bytes: usize, took: Duration, alongside: f64) {
        let secs = took.as_secs_f64().max(1e-6);
        let mut state = self.state();
        let rtt = state.rtts.iter().min().copied().unwrap_or_default();
        let side = &mut state.sides[tag.direction as usize];
        if bytes >= RATE_FLOOR {
            side.request_rate.add(bytes as f64 / secs);
            let body = (secs - rtt.as_secs_f64()).max(secs / 8.0);
            side.body_rate.add(bytes as f64 / body);
        }
        let average = &mut side.carried[tag.mode as usize];
        if tag.measured && tag.epoch >= average.since_epoch {
            average.add(bytes as f64 / secs * alongside);
            if side.chosen == Some(tag.mode) && side.probe.is_none() {
                side.measured_since += 1;
            }
        }
    }

    /// How a transfer of `len` bytes in `direction` goes, with the lane as it is. `fixed`:
    /// the configured part size (`Some(0)`: never parts), which keeps the rule of fixed
    /// parts; `None`: the link decides. `multipart`: whether a store may go in parts at all
    /// (an S3 store that has not refused them).
    pub(crate) fn plan(
        &self,
        direction: Direction,
        len: usize,
        lane: Lane,
        fixed: Option<usize>,
    ) -> Plan {
        let d = direction as usize;
        let mut state = self.state();
        let rtt = state.rtts.iter().min().copied();
        let side = &mut state.sides[d];
        side.transfers += 1;
        let whole = |mode: Mode, measured: bool, epoch: u64| Plan {
            part_len: None,
            tag: Tag {
                direction,
                mode,
                epoch,
                measured,
            },
        };
        if let Some(part) = fixed {
            let parts = cold_parts(direction, len, part, lane);
            let mut plan = whole(Mode::Whole, false, side.epoch);
            if parts >= 2 {
                plan.part_len = Some(part);
                plan.tag.mode = Mode::Split;
            }
            return plan;
        }
        let most = most_parts(direction, len, lane);
        let split_part = |parts: usize| match direction {
            Direction::Load => len.div_ceil(parts),
            Direction::Store => (len / parts).max(MIN_STORE_PART),
        };
        side.decide();
        let worth = split_is_worth(direction, len, most, rtt, side.body_rate.get());
        let cold = cold_parts(
            direction,
            len,
            match direction {
                Direction::Load => COLD_LOAD_PART,
                Direction::Store => COLD_STORE_PART,
            },
            lane,
        );
        // The mode this transfer is meant to go in, and whether it is measured.
        let (mut intended, mut measured) = match side.chosen {
            None => (if cold >= 2 { Mode::Split } else { Mode::Whole }, true),
            Some(mode) => (mode, true),
        };
        if let Some(probe) = &mut side.probe {
            if !probe.planned {
                intended = probe.mode;
                measured = probe.unmeasured == 0;
                probe.unmeasured = probe.unmeasured.saturating_sub(1);
                probe.left -= 1;
                probe.planned = probe.left == 0;
            }
        } else if side.chosen.is_some() {
            side.since_decision += 1;
            if side.since_decision >= side.gap
                && most >= 2
                && (side.chosen == Some(Mode::Split) || worth)
            {
                let other = match side.chosen {
                    Some(Mode::Whole) => Mode::Split,
                    _ => Mode::Whole,
                };
                side.start_probe(other, lane);
                intended = other;
                measured = false;
            }
        } else if side.carried[intended as usize].count >= ENOUGH {
            // Measured under the rule of fixed parts: from now on the link decides.
            side.chosen = Some(intended);
            side.decided_at = side.carried[intended as usize].value;
            side.gap = 0;
        }
        let parts = match (side.chosen, intended) {
            (None, _) => cold,
            (_, Mode::Whole) => 1,
            // Parts that would save little go whole, unmeasured.
            (_, Mode::Split) if !worth => 1,
            (_, Mode::Split) => most,
        };
        // A transfer that cannot go as intended (too small to split) measures nothing.
        let mode = if parts >= 2 { Mode::Split } else { Mode::Whole };
        let measured = measured && mode == intended;
        let mut plan = whole(mode, measured, side.epoch);
        if parts >= 2 {
            plan.part_len = Some(match side.chosen {
                None => match direction {
                    Direction::Load => COLD_LOAD_PART,
                    Direction::Store => COLD_STORE_PART,
                },
                Some(_) => split_part(parts),
            });
        }
        plan
    }

    /// What the link looks like now, and what the tier did on it.
    pub(crate) fn report(&self) -> LinkReport {
        let state = self.state();
        let side = |d: Direction| {
            let s = &state.sides[d as usize];
            DirectionReport {
                chosen: s.chosen,
                carried: [s.carried[0].get(), s.carried[1].get()],
                connection_rate: s.request_rate.get(),
                transfers: s.transfers,
                requests: self.sent[d as usize].load(Ordering::Relaxed),
                probes: s.probes,
            }
        };
        LinkReport {
            round_trip: state.rtts.iter().min().copied(),
            load: side(Direction::Load),
            store: side(Direction::Store),
        }
    }
}

impl Side {
    fn start_probe(&mut self, mode: Mode, lane: Lane) {
        self.epoch += 1;
        self.carried[mode as usize].restart(self.epoch);
        let warm = lane.in_flight.max(1) as u64;
        self.probe = Some(Probe {
            mode,
            // The first `warm` transfers share the link with the other mode's.
            left: warm + 16,
            unmeasured: warm,
            planned: false,
        });
        self.probes += 1;
        self.since_decision = 0;
    }

    /// Ends a probe that has planned all its transfers and measured enough of them, and
    /// keeps the mode that carried more; asks for a probe soon when the chosen mode's
    /// measurements moved far from what decided it.
    fn decide(&mut self) {
        let Some(chosen) = self.chosen else {
            return;
        };
        if let Some(probe) = self.probe {
            let tried = self.carried[probe.mode as usize];
            if !probe.planned {
                return;
            }
            if tried.count < ENOUGH {
                // Not measured yet (or never: too few of its transfers could go that way).
                self.since_decision += 1;
                if self.since_decision < 4 * FIRST_GAP {
                    return;
                }
            }
            self.probe = None;
            self.since_decision = 0;
            let kept = self.carried[chosen as usize].get().unwrap_or(0.0);
            let tried_value = tried.get().filter(|_| tried.count >= ENOUGH);
            // Parts must carry BETTER times more than whole objects to be worth their
            // requests, whichever of the two is in use.
            let switch = tried_value.is_some_and(|t| match probe.mode {
                Mode::Split => t >= BETTER * kept,
                Mode::Whole => BETTER * t > kept,
            });
            match (switch, tried_value) {
                (true, Some(t)) => {
                    self.chosen = Some(probe.mode);
                    self.decided_at = t;
                    self.gap = FIRST_GAP;
                }
                _ => {
                    self.decided_at = kept;
                    self.gap = (self.gap * 4).clamp(FIRST_GAP, LAST_GAP);
                }
            }
            self.measured_since = 0;
            return;
        }
        let now = self.carried[chosen as usize].get().unwrap_or(0.0);
        if self.measured_since >= 4 * ENOUGH
            && self.decided_at > 0.0
            && (now > 2.0 * self.decided_at || now < self.decided_at / 2.0)
        {
            // The link changed: probe soon, and often again.
            self.gap = 0;
            self.decided_at = now;
            self.measured_since = 0;
        }
    }
}

/// Parts of the rule of fixed parts: loads of more than one part, stores of two whole
/// parts or more, while a quarter of the lane or fewer are in flight; else 1.
fn cold_parts(direction: Direction, len: usize, part: usize, lane: Lane) -> usize {
    if part == 0 || !lane.quarter_or_less() {
        return 1;
    }
    match direction {
        Direction::Load if len > part => len.div_ceil(part),
        Direction::Store if len / part >= 2 => len / part,
        _ => 1,
    }
}

/// The most parts a transfer of `len` bytes may go in: the lane's share of connections,
/// and parts no smaller than the direction allows.
fn most_parts(direction: Direction, len: usize, lane: Lane) -> usize {
    let by_size = match direction {
        Direction::Load => len / MIN_LOAD_PART,
        Direction::Store => len / MIN_STORE_PART,
    };
    lane.share().min(by_size).max(1)
}

/// Whether `parts` would save a tenth of a transfer's expected time: its body at one
/// connection's measured rate, plus a round trip (a multipart upload two more). Unknown
/// rates are worth a try.
fn split_is_worth(
    direction: Direction,
    len: usize,
    parts: usize,
    rtt: Option<Duration>,
    body_rate: Option<f64>,
) -> bool {
    let Some(rate) = body_rate else {
        return parts >= 2;
    };
    if parts < 2 {
        return false;
    }
    let rtt = rtt.unwrap_or_default().as_secs_f64();
    let body = len as f64 / rate;
    let extra = match direction {
        Direction::Load => 0.0,
        Direction::Store => 2.0 * rtt,
    };
    let saved = body * (1.0 - 1.0 / parts as f64) - extra;
    saved >= 0.1 * (rtt + body)
}

#[cfg(test)]
mod tests;
