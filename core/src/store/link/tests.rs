//! The link's decisions, on links simulated from their physics: each request takes a round
//! trip plus its bytes at a rate, which on a capped link is each connection's own and on a
//! CPU-bound one is a total shared by every request in flight.

use super::*;

const MIB: usize = 1 << 20;
const LANE: Lane = Lane {
    in_flight: 16,
    most: 64,
};

/// A simulated link: a round trip, and a rate per connection or shared by all.
#[derive(Clone, Copy)]
enum Sim {
    Capped { rtt_ms: f64, per_connection: f64 },
    Shared { rtt_ms: f64, total: f64 },
}

impl Sim {
    /// The time of one request of `bytes` with `alongside` requests in flight.
    fn took(self, bytes: usize, alongside: f64) -> Duration {
        let secs = match self {
            Sim::Capped {
                rtt_ms,
                per_connection,
            } => rtt_ms / 1e3 + bytes as f64 / per_connection,
            Sim::Shared { rtt_ms, total } => rtt_ms / 1e3 + bytes as f64 * alongside / total,
        };
        Duration::from_secs_f64(secs)
    }

    fn rtt(self) -> Duration {
        let (Sim::Capped { rtt_ms, .. } | Sim::Shared { rtt_ms, .. }) = self;
        Duration::from_secs_f64(rtt_ms / 1e3)
    }
}

/// Runs `transfers` transfers of `len` bytes in `direction` with the lane's 16 in flight,
/// each request reported as the simulated link would take it; returns the parts of each.
fn run(link: &Link, sim: Sim, direction: Direction, len: usize, transfers: usize) -> Vec<usize> {
    let mut parts_of = Vec::new();
    for _ in 0..transfers {
        let plan = link.plan(direction, len, LANE, None);
        let parts = plan.part_len.map_or(1, |p| match direction {
            Direction::Load => len.div_ceil(p),
            Direction::Store => len / p,
        });
        // Every transfer in flight goes the same way (the lane's 16 at once).
        let alongside = (LANE.in_flight * parts) as f64;
        for i in 0..parts {
            let bytes = match plan.part_len {
                None => len,
                Some(p) if i + 1 < parts => p,
                Some(p) => len - p * (parts - 1),
            };
            link.head_after(sim.rtt());
            link.record(plan.tag, bytes, sim.took(bytes, alongside), alongside);
        }
        parts_of.push(parts);
    }
    parts_of
}

fn mean(parts: &[usize]) -> f64 {
    parts.iter().sum::<usize>() as f64 / parts.len() as f64
}

const CAPPED_40: Sim = Sim::Capped {
    rtt_ms: 40.0,
    per_connection: 25e6,
};
const LOOPBACK: Sim = Sim::Shared {
    rtt_ms: 0.2,
    total: 1.5e9,
};

#[test]
fn a_capped_link_splits_small_loads_on_the_lanes_share_of_connections() {
    let link = Link::default();
    let parts = run(&link, CAPPED_40, Direction::Load, 2 * MIB, 400);
    let report = link.report();
    assert_eq!(report.load.chosen, Some(Mode::Split), "{report:?}");
    // Before it measured: 2 MiB is one GET (8 MiB parts); after: 4 parts of 512 KiB.
    assert_eq!(parts[0], 1);
    assert!(mean(&parts[200..]) > 3.0, "{:?}", &parts[200..]);
    // Split, 4 parts of 512 KiB (but during the probes of whole objects).
    assert_eq!(parts.iter().max(), Some(&4));
    assert!(parts[200..].iter().all(|&p| p == 1 || p == 4));
    assert_eq!(report.round_trip, Some(Duration::from_millis(40)));
}

#[test]
fn a_cpu_bound_link_keeps_one_request_per_object_and_probes_rarely() {
    let link = Link::default();
    let parts = run(&link, LOOPBACK, Direction::Load, 2 * MIB, 2000);
    let report = link.report();
    assert_eq!(report.load.chosen, Some(Mode::Whole), "{report:?}");
    let split = parts.iter().filter(|&&p| p > 1).count();
    assert!(split > 0, "the other mode was never tried");
    assert!(
        split * 10 < parts.len(),
        "{split} of {} transfers split on a CPU-bound link",
        parts.len()
    );
    assert!(parts[1500..].iter().filter(|&&p| p > 1).count() <= 32);
}

#[test]
fn the_choice_follows_a_link_that_changes() {
    let link = Link::default();
    run(&link, CAPPED_40, Direction::Load, 2 * MIB, 300);
    assert_eq!(link.report().load.chosen, Some(Mode::Split));
    let parts = run(&link, LOOPBACK, Direction::Load, 2 * MIB, 1500);
    assert_eq!(link.report().load.chosen, Some(Mode::Whole));
    assert!(mean(&parts[1000..]) < 1.2);
    run(&link, CAPPED_40, Direction::Load, 2 * MIB, 1500);
    assert_eq!(link.report().load.chosen, Some(Mode::Split));
}

#[test]
fn stores_split_only_into_parts_s3_takes() {
    let link = Link::default();
    // 2 MiB objects cannot be cut into 5 MiB parts: one PUT each, however capped.
    let parts = run(&link, CAPPED_40, Direction::Store, 2 * MIB, 300);
    assert!(parts.iter().all(|&p| p == 1));
    assert_eq!(link.report().store.probes, 0);
    // 32 MiB: 16 MiB parts before measuring (the fixed rule), then the lane's share of
    // connections: 4 parts of 8 MiB.
    let link = Link::default();
    let parts = run(&link, CAPPED_40, Direction::Store, 32 * MIB, 300);
    assert_eq!(parts[0], 2);
    assert_eq!(link.report().store.chosen, Some(Mode::Split));
    assert!(mean(&parts[200..]) > 3.0, "{:?}", &parts[200..]);
    assert_eq!(parts.iter().max(), Some(&4));
    // 12 MiB with 2 connections a transfer: two parts of 6 MiB.
    let lane = Lane {
        in_flight: 32,
        most: 64,
    };
    assert_eq!(
        link.plan(Direction::Store, 12 * MIB, lane, None).part_len,
        Some(6 * MIB)
    );
}

#[test]
fn parts_stay_within_the_lane() {
    let link = Link::default();
    run(&link, CAPPED_40, Direction::Load, 2 * MIB, 300);
    let busy = Lane {
        in_flight: 64,
        most: 64,
    };
    assert_eq!(
        link.plan(Direction::Load, 2 * MIB, busy, None).part_len,
        None
    );
    let two_each = Lane {
        in_flight: 32,
        most: 64,
    };
    assert_eq!(
        link.plan(Direction::Load, 2 * MIB, two_each, None).part_len,
        Some(MIB)
    );
    // No load part under MIN_LOAD_PART.
    assert_eq!(
        link.plan(Direction::Load, 300 << 10, LANE, None).part_len,
        None
    );
}

#[test]
fn configured_part_sizes_keep_the_fixed_rule() {
    let link = Link::default();
    run(&link, CAPPED_40, Direction::Load, 2 * MIB, 300);
    // Measured as a capped link, but a configured size is what parts are cut to, while a
    // quarter of the lane or fewer are in flight.
    let fixed = Some(8 * MIB);
    assert_eq!(
        link.plan(Direction::Load, 2 * MIB, LANE, fixed).part_len,
        None
    );
    assert_eq!(
        link.plan(Direction::Load, 32 * MIB, LANE, fixed).part_len,
        Some(8 * MIB)
    );
    let busier = Lane {
        in_flight: 17,
        most: 64,
    };
    assert_eq!(
        link.plan(Direction::Load, 32 * MIB, busier, fixed).part_len,
        None
    );
    assert_eq!(
        link.plan(Direction::Load, 32 * MIB, LANE, Some(0)).part_len,
        None
    );
    assert_eq!(
        link.plan(Direction::Store, 32 * MIB, LANE, Some(16 * MIB))
            .part_len,
        Some(16 * MIB)
    );
    assert_eq!(
        link.plan(Direction::Store, (32 * MIB) - 1, LANE, Some(16 * MIB))
            .part_len,
        None
    );
}

#[test]
fn the_fixed_rule_takes_a_quarter_of_the_lane() {
    let lane = |in_flight, most| Lane { in_flight, most };
    assert!(lane(1, 64).quarter_or_less());
    assert!(lane(16, 64).quarter_or_less());
    assert!(!lane(17, 64).quarter_or_less());
    assert!(lane(1, 1).quarter_or_less());
    assert!(!lane(2, 2).quarter_or_less());
    assert!(!lane(5, 8).quarter_or_less() && lane(2, 8).quarter_or_less());
}

#[test]
fn a_split_that_saves_little_is_not_tried() {
    // 2 MiB at 2 GB/s a connection behind a 40 ms round trip: a millisecond of body.
    assert!(!split_is_worth(
        Direction::Load,
        2 * MIB,
        4,
        Some(Duration::from_millis(40)),
        Some(2e9)
    ));
    assert!(split_is_worth(
        Direction::Load,
        2 * MIB,
        4,
        Some(Duration::from_millis(50)),
        Some(100e6)
    ));
    // A multipart upload costs two round trips more.
    assert!(!split_is_worth(
        Direction::Store,
        12 * MIB,
        2,
        Some(Duration::from_millis(50)),
        Some(200e6)
    ));
    assert!(split_is_worth(Direction::Load, 2 * MIB, 4, None, None));
}
