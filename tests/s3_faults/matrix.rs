//! The fault matrix: every fault against every operation and path on s3s-fs, written to
//! `target/test-logs/fault-matrix.md` (docs/reliability.md quotes it).

use std::collections::HashMap;
use std::time::Duration;

use kvtier_core::{JobKind, JobResult, LookupResult, Tier};
use serde_json::{json, Value};

use crate::common::*;
use crate::support::proxy::{Fault, RequestInfo};
use crate::support::*;

/// One-key jobs (or lookups) per cell.
const N: u64 = 40;

/// One cell of the fault matrix: what happened to its jobs.
#[derive(Default)]
struct Cell {
    jobs: u64,
    /// A job (or lookup) reported OK with wrong bytes, or HIT for an absent key.
    wrong: u64,
    lost: u64,
    duplicated: u64,
    /// Jobs that succeeded (lookups: answered correctly) despite the fault.
    recovered: u64,
}

/// A row of the table: the fault, the operation, the path, and its cell.
type Row = (String, &'static str, &'static str, Cell);

/// Half of the requests with `method` to block objects (a hash of the request number) get
/// `fault`; the rest pass.
fn half_of(method: &'static str, fault: Fault, salt: u64) -> impl Fn(&RequestInfo) -> Fault {
    let pick = one_in(2, salt);
    move |r: &RequestInfo| {
        if r.method == method && r.path.contains(".bin") && pick(r) {
            fault
        } else {
            Fault::Pass
        }
    }
}

/// Every result of `n` jobs numbered `first..first + n`: lost and duplicated ones counted.
fn collect(tier: &Tier, first: u64, n: u64, cell: &mut Cell) -> HashMap<u64, JobResult> {
    tier.drain(Duration::from_secs(300))
        .expect("jobs did not finish within 300 s");
    let mut seen = HashMap::new();
    for r in tier.poll(usize::MAX) {
        let id = r.job_id;
        if seen.insert(id, r).is_some() {
            cell.duplicated += 1;
        }
    }
    cell.lost += (first..first + n)
        .filter(|id| !seen.contains_key(id))
        .count() as u64;
    seen
}

/// The cells, one after another on one server, each with its own keys and fault pattern.
struct Cells<'a> {
    front: Front<'a>,
    /// The fault pattern's salt, one more for each cell.
    salt: u64,
    /// The first key's number (and the pool's random seed), 1000 more for each cell.
    base: u64,
}

impl Cells<'_> {
    /// The next cell's tier (every request passing while it starts) on the direct path or
    /// not, with `top_extra`, and `blocks` blocks of random bytes registered with it.
    fn next(&mut self, direct: bool, top_extra: Value, blocks: u64) -> (Tier, Pool, Cell) {
        self.salt += 1;
        self.base += 1000;
        self.front.proxy.set_rule(|_| Fault::Pass);
        let tier = self.tier(direct, top_extra);
        let pool = Pool::random_registered(&tier, blocks, BLOCK, self.base);
        let cell = Cell {
            jobs: N,
            ..Default::default()
        };
        (tier, pool, cell)
    }

    fn tier(&self, direct: bool, top_extra: Value) -> Tier {
        self.front.tier(
            json!({"max_retries": 3, "request_timeout_ms": 1000, "direct_http": direct}),
            top_extra,
        )
    }

    /// Lets half of the requests with `method` to block objects get `fault`.
    fn fault_half_of(&self, method: &'static str, fault: Fault) {
        self.front.proxy.set_rule(half_of(method, fault, self.salt));
    }
}

fn path_name(direct: bool) -> &'static str {
    if direct {
        "direct"
    } else {
        "general"
    }
}

/// Stores in both conditional and overwriting mode, on the general path; a success counts
/// as wrong when the stored object is not the block's bytes.
fn store_rows(cells: &mut Cells, faults: &[(&str, Fault)]) -> Vec<Row> {
    let mut rows = Vec::new();
    for &(name, fault) in faults {
        for mode in ["conditional", "skip_known"] {
            let (tier, pool, mut cell) = cells.next(true, json!({"dedup": mode}), N);
            let base = cells.base;
            cells.fault_half_of("PUT", fault);
            for i in 0..N {
                tier.submit(JobKind::Store, i, &[i], keys(&[base + i]))
                    .unwrap();
            }
            let results = collect(&tier, 0, N, &mut cell);
            cells.front.proxy.set_rule(|_| Fault::Pass);
            let direct_store = cells.front.srv.store_json(&cells.front.bucket);
            for (id, r) in &results {
                if r.succeeded() {
                    cell.recovered += 1;
                    let name = tier.layout().object_name(&key(base + id)).unwrap();
                    if oob_get(&direct_store, &name).as_deref() != Some(pool.block(*id)) {
                        cell.wrong += 1;
                    }
                }
            }
            let op = if mode == "conditional" {
                "store (conditional)"
            } else {
                "store (skip_known)"
            };
            rows.push((name.to_string(), op, "general", cell));
        }
    }
    rows
}

/// Loads on both paths of what was stored fault-free; a success counts as wrong when the
/// loaded bytes are not the stored ones.
fn load_rows(cells: &mut Cells, faults: &[(&str, Fault)]) -> Vec<Row> {
    let mut rows = Vec::new();
    for &(name, fault) in faults {
        for direct in [true, false] {
            let (tier, pool, mut cell) = cells.next(direct, json!({}), 2 * N);
            let base = cells.base;
            let ids: Vec<u64> = (0..N).collect();
            let stored: Vec<u64> = ids.iter().map(|i| base + i).collect();
            assert!(
                run_job(&tier, JobKind::Store, 0, &ids, &stored).succeeded(),
                "{name}: setup store failed"
            );
            cells.fault_half_of("GET", fault);
            for i in 0..N {
                tier.submit(JobKind::Load, 1 + i, &[N + i], keys(&[base + i]))
                    .unwrap();
            }
            for (id, r) in collect(&tier, 1, N, &mut cell) {
                if r.succeeded() {
                    cell.recovered += 1;
                    if pool.block(N + id - 1) != pool.block(id - 1) {
                        cell.wrong += 1;
                    }
                }
            }
            rows.push((name.to_string(), "load", path_name(direct), cell));
        }
    }
    rows
}

/// Lookups on both paths, of keys half of which were stored (the even ones) by another
/// tier; a HIT for an absent key counts as wrong.
fn lookup_rows(cells: &mut Cells, faults: &[(&str, Fault)]) -> Vec<Row> {
    let mut rows = Vec::new();
    for &(name, fault) in faults {
        for direct in [true, false] {
            let (tier, _pool, mut cell) = cells.next(direct, json!({}), N);
            let base = cells.base;
            // Even keys are stored, odd ones are not.
            let present: Vec<u64> = (0..N).step_by(2).map(|i| base + i).collect();
            let blocks: Vec<u64> = (0..present.len() as u64).collect();
            assert!(
                run_job(&tier, JobKind::Store, 0, &blocks, &present).succeeded(),
                "{name}: setup store failed"
            );
            // A fresh tier, so that no key is known from the store.
            drop(tier);
            let tier = cells.tier(direct, json!({}));
            cells.fault_half_of("HEAD", fault);
            // One request per key (a failed check fails only its own request's group), all
            // in one step, so that the checks run concurrently.
            for i in 0..N {
                tier.lookup(i, &key(base + i)).unwrap();
            }
            tier.schedule_end().unwrap();
            for i in 0..N {
                let found = resolve_lookup(&tier, i, &key(base + i)) == LookupResult::Hit;
                let truth = i % 2 == 0;
                if found && !truth {
                    cell.wrong += 1;
                }
                if found == truth {
                    cell.recovered += 1;
                }
            }
            rows.push((name.to_string(), "lookup", path_name(direct), cell));
        }
    }
    rows
}

/// Runs every fault against every operation and path on s3s-fs, 40 one-key jobs (or
/// lookups) per cell with the fault on half of the cell's requests, and writes the table
/// to `target/test-logs/fault-matrix.md` (the README's reliability section quotes it).
/// Asserts what must hold whatever the machine's load: no wrong success, no lost or
/// duplicated job, and conditional stores recovering as well as overwriting ones.
pub fn fault_matrix() {
    let srv = Server::s3s_fs();
    let stall = Fault::StallResponse(Duration::from_secs(3));
    let store_faults = [
        ("reset", Fault::ResetRequest),
        ("closed before the server", Fault::DropRequest),
        ("closed after the server", Fault::DropResponse),
        ("stall after the server", stall),
        ("500", Fault::Status(500)),
        ("503 SlowDown", Fault::Status(503)),
    ];
    let load_faults = [
        ("reset", Fault::ResetRequest),
        ("closed before the server", Fault::DropRequest),
        ("stall", stall),
        ("500", Fault::Status(500)),
        ("503 SlowDown", Fault::Status(503)),
        ("body cut", Fault::CutResponse),
        ("short 206 body", Fault::ShortResponse),
        ("short 200 body", Fault::Short200),
        ("corrupted in transit", Fault::CorruptBody),
        ("Range ignored", Fault::IgnoreRange),
    ];
    // A lookup's HEAD has no body to cut, shorten or corrupt: the load's faults before one.
    let lookup_faults = &load_faults[..5];
    let mut cells = Cells {
        front: Front::new(&srv),
        salt: 0,
        base: 0,
    };
    let mut rows = store_rows(&mut cells, &store_faults);
    rows.extend(load_rows(&mut cells, &load_faults));
    rows.extend(lookup_rows(&mut cells, lookup_faults));
    let mut table = String::from(
        "| fault (on half the requests) | operation | path | jobs | wrong successes | lost | duplicated | recovered |\n\
         |---|---|---|---:|---:|---:|---:|---:|\n",
    );
    for (fault, op, path, c) in &rows {
        table.push_str(&format!(
            "| {fault} | {op} | {path} | {} | {} | {} | {} | {} |\n",
            c.jobs, c.wrong, c.lost, c.duplicated, c.recovered
        ));
    }
    let out = manifest_dir().join("target/test-logs");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("fault-matrix.md"), &table).unwrap();
    println!("{table}");
    for (fault, op, path, c) in &rows {
        assert_eq!(
            (c.wrong, c.lost, c.duplicated),
            (0, 0, 0),
            "{fault} / {op} / {path}\n{table}"
        );
    }
    // Interrupted conditional PUTs are repeated like overwriting ones.
    for pair in rows.chunks(2).take(store_faults.len()) {
        let (conditional, skip_known) = (&pair[0].3, &pair[1].3);
        assert!(
            conditional.recovered + N / 4 >= skip_known.recovered,
            "{}: conditional stores recover less\n{table}",
            pair[0].0
        );
    }
}
