//! The local store's data path two ways, side by side in one run: a fixed pool of threads
//! making positional system calls (what the store does: a block per thread at a time, moved
//! by `pwrite`/`pread` in 256 KiB pieces, on `file_io_threads` threads) and io_uring from
//! one thread with `--inflight` pieces in flight; plus a lookup batch (`fstatat` one by one against `IORING_OP_STATX`
//! submitted together).
//!
//! Only the data moves are timed: files are created before a store and opened before a
//! load, outside the clock, since creating, renaming and opening cost the same system calls
//! either way. CPU is the process's user + system time (`getrusage`), which includes
//! io_uring's kernel workers (they are threads of the process). Every loaded byte is
//! compared with what was stored.
//!
//! ```sh
//! cargo run --release --example uring-vs-threads -- [--dir D] [--block-size 2M] [--blocks 256]
//!     [--threads 16] [--inflight 16] [--reps 5]
//! ```

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use io_uring::{opcode, types, IoUring};

/// The store's piece size (core/src/store/local.rs).
const PIECE: usize = 256 << 10;
const ALIGN: usize = 4096;

struct Options {
    dir: PathBuf,
    block: usize,
    blocks: usize,
    threads: usize,
    inflight: usize,
    reps: usize,
}

fn parse_size(s: &str) -> usize {
    let (digits, unit) = s.split_at(s.trim_end_matches(['K', 'M', 'G']).len());
    let n: usize = digits.parse().expect("a size such as 256K or 2M");
    n << match unit {
        "K" => 10,
        "M" => 20,
        "G" => 30,
        _ => 0,
    }
}

fn options() -> Options {
    let mut o = Options {
        dir: PathBuf::from("target/bench-uring"),
        block: 2 << 20,
        blocks: 256,
        threads: 16,
        inflight: 16,
        reps: 5,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        let value = pair.get(1).map(String::as_str).unwrap_or("");
        match pair[0].as_str() {
            "--dir" => o.dir = PathBuf::from(value),
            "--block-size" => o.block = parse_size(value),
            "--blocks" => o.blocks = value.parse().expect("--blocks N"),
            "--threads" => o.threads = value.parse().expect("--threads N"),
            "--inflight" => o.inflight = value.parse().expect("--inflight N"),
            "--reps" => o.reps = value.parse().expect("--reps N"),
            other => panic!("unknown option {other}"),
        }
    }
    assert!(
        o.block.is_multiple_of(ALIGN),
        "the block size must be a multiple of 4 KiB"
    );
    o
}

/// Page-aligned memory (O_DIRECT needs it).
struct Pool {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the pool is plain memory; the benchmark gives each piece to one writer at a time.
unsafe impl Send for Pool {}
unsafe impl Sync for Pool {}

impl Pool {
    fn new(len: usize) -> Pool {
        let layout = std::alloc::Layout::from_size_align(len, ALIGN).unwrap();
        // SAFETY: a non-zero layout; freed in Drop with the same layout.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        Pool { ptr, len }
    }
    fn slice(&mut self) -> &mut [u8] {
        // SAFETY: the allocation is `len` bytes and lives as long as `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
    /// The piece at `at..at + len`.
    ///
    /// # Safety
    /// The range is inside the pool and no other reference to it is alive.
    #[allow(clippy::mut_from_ref)]
    unsafe fn piece(&self, at: usize, len: usize) -> &mut [u8] {
        assert!(at + len <= self.len);
        std::slice::from_raw_parts_mut(self.ptr.add(at), len)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len, ALIGN).unwrap();
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, layout) };
    }
}

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

#[derive(Clone, Copy, PartialEq)]
enum Op {
    Store,
    Load,
}

/// One piece to move: file, offset in it, and where in the pool.
struct Piece {
    file: usize,
    offset: usize,
    at: usize,
    len: usize,
}

fn pieces(o: &Options) -> Vec<Piece> {
    let mut out = Vec::new();
    for file in 0..o.blocks {
        let mut offset = 0;
        while offset < o.block {
            let len = PIECE.min(o.block - offset);
            out.push(Piece {
                file,
                offset,
                at: file * o.block + offset,
                len,
            });
            offset += len;
        }
    }
    out
}

fn open_files(o: &Options, op: Op, direct: bool) -> Vec<File> {
    (0..o.blocks)
        .map(|i| {
            let mut options = OpenOptions::new();
            match op {
                Op::Store => options.write(true).create(true).truncate(true),
                Op::Load => options.read(true),
            };
            if direct {
                options.custom_flags(libc::O_DIRECT);
            }
            options
                .open(o.dir.join(format!("block-{i}.bin")))
                .expect("open a block file")
        })
        .collect()
}

/// The fixed thread pool, as the store uses it: each thread takes the next block and moves
/// its pieces in order, one system call each.
fn run_threads(o: &Options, files: &[File], pool: &Pool, op: Op) {
    let pieces = pieces(o);
    let per_block = o.block.div_ceil(PIECE);
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..o.threads {
            scope.spawn(|| loop {
                let block = next.fetch_add(1, Ordering::Relaxed);
                if block >= o.blocks {
                    break;
                }
                for p in &pieces[block * per_block..(block + 1) * per_block] {
                    // SAFETY: each block is taken by one thread (the counter hands it out once).
                    let memory = unsafe { pool.piece(p.at, p.len) };
                    let file = &files[p.file];
                    match op {
                        Op::Store => file.write_all_at(memory, p.offset as u64).unwrap(),
                        Op::Load => file.read_exact_at(memory, p.offset as u64).unwrap(),
                    }
                }
            });
        }
    });
}

/// io_uring from one thread, `inflight` pieces submitted at a time.
fn run_uring(o: &Options, files: &[File], pool: &Pool, op: Op) {
    let pieces = pieces(o);
    let mut ring = IoUring::new((o.inflight * 2).next_power_of_two() as u32).unwrap();
    let (mut next, mut done, mut inflight) = (0, 0, 0);
    while done < pieces.len() {
        while inflight < o.inflight && next < pieces.len() {
            let p = &pieces[next];
            let fd = types::Fd(files[p.file].as_raw_fd());
            // SAFETY: pointers into the pool, which outlives the ring's use of them.
            let ptr = unsafe { pool.ptr.add(p.at) };
            let entry = match op {
                Op::Store => opcode::Write::new(fd, ptr, p.len as u32)
                    .offset(p.offset as u64)
                    .build(),
                Op::Load => opcode::Read::new(fd, ptr, p.len as u32)
                    .offset(p.offset as u64)
                    .build(),
            }
            .user_data(next as u64);
            // SAFETY: the entry's buffer and file stay valid until its completion is reaped.
            unsafe { ring.submission().push(&entry).expect("room in the ring") };
            next += 1;
            inflight += 1;
        }
        ring.submit_and_wait(1).unwrap();
        for cqe in ring.completion() {
            let p = &pieces[cqe.user_data() as usize];
            assert_eq!(cqe.result(), p.len as i32, "a short or failed piece");
            done += 1;
            inflight -= 1;
        }
    }
}

fn stat_names(o: &Options, round: usize) -> Vec<CString> {
    // As a lookup batch: half stored blocks, half names never stored.
    (0..256)
        .map(|i| {
            let name = if i % 2 == 0 {
                format!("block-{}.bin", (i / 2) % o.blocks)
            } else {
                format!("absent-{round}-{i}.bin")
            };
            CString::new(name).unwrap()
        })
        .collect()
}

fn stat_sequential(dir: i32, names: &[CString]) -> usize {
    names
        .iter()
        .filter(|name| {
            // SAFETY: plain data filled by fstatat; NUL-terminated name.
            unsafe {
                let mut st: libc::stat = std::mem::zeroed();
                libc::fstatat(dir, name.as_ptr(), &mut st, 0) == 0
            }
        })
        .count()
}

fn stat_uring(dir: i32, names: &[CString]) -> usize {
    let mut ring = IoUring::new(512).unwrap();
    // SAFETY: plain data, filled by the kernel.
    let mut out: Vec<libc::statx> = vec![unsafe { std::mem::zeroed() }; names.len()];
    for (i, name) in names.iter().enumerate() {
        let entry = opcode::Statx::new(
            types::Fd(dir),
            name.as_ptr(),
            &mut out[i] as *mut libc::statx as *mut _,
        )
        .mask(libc::STATX_TYPE)
        .build()
        .user_data(i as u64);
        // SAFETY: names and outputs outlive the wait below.
        unsafe { ring.submission().push(&entry).expect("room in the ring") };
    }
    ring.submit_and_wait(names.len()).unwrap();
    ring.completion().filter(|c| c.result() == 0).count()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn drop_cache(dir: &Path, blocks: usize) {
    for i in 0..blocks {
        let file = File::open(dir.join(format!("block-{i}.bin"))).unwrap();
        // SAFETY: advice on an open descriptor.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
}

fn main() {
    let o = options();
    std::fs::create_dir_all(&o.dir).unwrap();
    let bytes = o.block * o.blocks;
    let mut source = Pool::new(bytes);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for chunk in source.slice().chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    let mut dest = Pool::new(bytes);
    println!(
        "{} blocks of {} KiB, pieces of {} KiB; threads: {}, io_uring: {} in flight; medians of {} \
         (dir {})",
        o.blocks,
        o.block >> 10,
        PIECE >> 10,
        o.threads,
        o.inflight,
        o.reps,
        o.dir.display()
    );
    println!(
        "| mode | op | threads MiB/s | threads CPU-s/GiB | io_uring MiB/s | io_uring CPU-s/GiB |"
    );
    println!("|---|---|---:|---:|---:|---:|");
    for direct in [false, true] {
        for op in [Op::Store, Op::Load] {
            let mut results = [(Vec::new(), Vec::new()), (Vec::new(), Vec::new())];
            for rep in 0..o.reps {
                // Alternate which goes first, so neither always meets the other's leftovers.
                let order = if rep % 2 == 0 { [0, 1] } else { [1, 0] };
                for which in order {
                    if op == Op::Load && direct {
                        drop_cache(&o.dir, o.blocks);
                    }
                    let files = open_files(&o, op, direct);
                    if op == Op::Load {
                        dest.slice().fill(0);
                    }
                    let pool = if op == Op::Store { &source } else { &dest };
                    let (t, c) = (Instant::now(), cpu_seconds());
                    if which == 0 {
                        run_threads(&o, &files, pool, op);
                    } else {
                        run_uring(&o, &files, pool, op);
                    }
                    let (wall, cpu) = (t.elapsed().as_secs_f64(), cpu_seconds() - c);
                    drop(files);
                    if op == Op::Load {
                        assert!(dest.slice() == source.slice(), "a loaded byte differs");
                    }
                    let gib = bytes as f64 / (1u64 << 30) as f64;
                    results[which]
                        .0
                        .push(bytes as f64 / (1 << 20) as f64 / wall);
                    results[which].1.push(cpu / gib);
                }
            }
            let [(tm, tc), (um, uc)] = results;
            println!(
                "| {} | {} | {:.0} | {:.3} | {:.0} | {:.3} |",
                if direct { "O_DIRECT" } else { "buffered" },
                if op == Op::Store { "store" } else { "load" },
                median(tm),
                median(tc),
                median(um),
                median(uc)
            );
        }
    }
    let dir = File::open(&o.dir).unwrap();
    let (mut seq, mut uring) = (Vec::new(), Vec::new());
    for round in 0..o.reps.max(5) * 4 {
        let names = stat_names(&o, round);
        let t = Instant::now();
        let found = if round % 2 == 0 {
            stat_sequential(dir.as_raw_fd(), &names)
        } else {
            stat_uring(dir.as_raw_fd(), &names)
        };
        let ms = t.elapsed().as_secs_f64() * 1e3;
        assert_eq!(found, 128, "half the names are stored blocks");
        if round % 2 == 0 {
            seq.push(ms)
        } else {
            uring.push(ms)
        }
    }
    println!(
        "256-name lookup batch (half stored): fstatat one by one {:.3} ms, IORING_OP_STATX together \
         {:.3} ms (medians)",
        median(seq),
        median(uring)
    );
    for i in 0..o.blocks {
        let _ = std::fs::remove_file(o.dir.join(format!("block-{i}.bin")));
    }
}
