//! A network-shaping TCP proxy on a loopback port in front of a real server: it makes a
//! loopback link look like the path to a remote object store.
//!
//! - **Round trip.** Every byte is held for half the round trip in each direction, as a
//!   link's propagation delay holds it, so a request waits a whole round trip for its first
//!   byte of answer. A new connection's first request waits one round trip more: the TCP
//!   handshake a real link charges before anything is sent (on loopback it is free).
//! - **Bandwidth.** Each connection is paced to a rate in each direction (a remote store's
//!   per-connection limit), and optionally all connections together to a total rate.
//!
//! It counts what a client did on the link: connections accepted, connections open at once
//! (the most of them), and bytes each way. It can also hold every answer until a number of
//! connections are open at once ([`Shaper::hold_answers_until_open`]): whether a client
//! puts a batch on the link together then shows without depending on how fast a busy
//! machine lets it send (nothing is answered early, so nothing closes early). A byte stream proxy, not an HTTP one: requests
//! are not parsed, so a pipelined or pooled connection is shaped as the link would shape it.
//!
//! Used by the latency tests (`tests/s3_latency.rs`) and, as the `shaper` example
//! (`bench/shaper.rs`), by the benchmarks. One thread with its own tokio runtime; dropping
//! the shaper ends it and its connections.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Notify};
use tokio::time::Instant;

/// What the link does to the bytes that cross it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Link {
    /// The round trip added to every exchange (half each way).
    pub round_trip: Duration,
    /// Bytes per second of one connection, in each direction; `None`: unlimited.
    pub per_connection: Option<u64>,
    /// Bytes per second of all connections together, in each direction; `None`: unlimited.
    pub total: Option<u64>,
}

/// What clients did on the link so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    pub accepted: u64,
    pub open: u64,
    /// The most connections open at one time.
    pub most_open: u64,
    /// Bytes from clients to the server, and back.
    pub bytes_up: u64,
    pub bytes_down: u64,
}

/// Paces a byte stream to a rate: each chunk may leave once the ones before it had the
/// time they need at that rate.
struct Pacer {
    bytes_per_s: u64,
    next_free: Instant,
}

impl Pacer {
    fn new(bytes_per_s: u64) -> Pacer {
        Pacer {
            bytes_per_s: bytes_per_s.max(1),
            next_free: Instant::now(),
        }
    }

    /// When a chunk of `len` bytes that is ready `at` has crossed; books its time.
    fn book(&mut self, at: Instant, len: usize) -> Instant {
        let start = self.next_free.max(at);
        let takes = Duration::from_secs_f64(len as f64 / self.bytes_per_s as f64);
        self.next_free = start + takes;
        self.next_free
    }
}

struct Inner {
    upstream: SocketAddr,
    link: Link,
    /// All connections' pacer of each direction (up, down), when the link has a total rate.
    total: Option<[Mutex<Pacer>; 2]>,
    accepted: AtomicU64,
    open: AtomicU64,
    most_open: AtomicU64,
    bytes: [AtomicU64; 2],
    /// Bytes each connection carried up and down, in the order they were accepted.
    by_connection: Mutex<Vec<Arc<[AtomicU64; 2]>>>,
    /// Answers are held until this many connections have been open at once, or until the
    /// instant passes (then the gate is gone for good).
    gate: Mutex<Option<(u64, Instant)>>,
    /// Told of every connection accepted (for the gate).
    accepted_one: Notify,
}

impl Inner {
    /// Waits while the answer gate holds.
    async fn through_gate(&self) {
        loop {
            // Registered before the check, so an accept between the two is not missed.
            let accepted = self.accepted_one.notified();
            let Some((open, until)) = *self.gate.lock().unwrap_or_else(|p| p.into_inner()) else {
                return;
            };
            if self.most_open.load(Ordering::SeqCst) >= open || Instant::now() >= until {
                *self.gate.lock().unwrap_or_else(|p| p.into_inner()) = None;
                return;
            }
            tokio::select! {
                _ = accepted => {}
                _ = tokio::time::sleep_until(until) => {}
            }
        }
    }
}

pub struct Shaper {
    port: u16,
    inner: Arc<Inner>,
    stop: watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Connections the kernel queues for the shaper before it accepts them.
const SHAPER_BACKLOG: libc::c_int = 4096;

impl Shaper {
    /// A shaper on a free loopback port in front of `127.0.0.1:upstream_port`.
    pub fn start(upstream_port: u16, link: Link) -> Shaper {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the shaper");
        // The standard library listens with a backlog of 128: a client opening a batch of
        // 256 connections at once (an existence batch) overflowed it, the kernel dropped
        // SYNs and they came back after the 1 s retransmit, a tail no remote store adds.
        // Listening again on a listening socket only changes its backlog (the kernel caps
        // it at net.core.somaxconn).
        // SAFETY: the descriptor is the listener's own, open for the call.
        let listened = unsafe {
            libc::listen(
                std::os::fd::AsRawFd::as_raw_fd(&std_listener),
                SHAPER_BACKLOG,
            )
        };
        assert_eq!(listened, 0, "listen on the shaper's socket");
        std_listener.set_nonblocking(true).expect("nonblocking");
        let port = std_listener.local_addr().expect("local addr").port();
        let inner = Arc::new(Inner {
            upstream: SocketAddr::from(([127, 0, 0, 1], upstream_port)),
            link,
            total: link
                .total
                .map(|rate| [Mutex::new(Pacer::new(rate)), Mutex::new(Pacer::new(rate))]),
            accepted: AtomicU64::new(0),
            open: AtomicU64::new(0),
            most_open: AtomicU64::new(0),
            bytes: [AtomicU64::new(0), AtomicU64::new(0)],
            by_connection: Mutex::new(Vec::new()),
            gate: Mutex::new(None),
            accepted_one: Notify::new(),
        });
        let (stop, stopped) = watch::channel(false);
        let serving = inner.clone();
        let thread = std::thread::Builder::new()
            .name("shaper".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .expect("shaper runtime");
                runtime.block_on(serve(std_listener, serving, stopped));
                // Connections still open end with the runtime.
                runtime.shutdown_background();
            })
            .expect("shaper thread");
        Shaper {
            port,
            inner,
            stop,
            thread: Some(thread),
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn traffic(&self) -> Traffic {
        let i = &self.inner;
        Traffic {
            accepted: i.accepted.load(Ordering::SeqCst),
            open: i.open.load(Ordering::SeqCst),
            most_open: i.most_open.load(Ordering::SeqCst),
            bytes_up: i.bytes[0].load(Ordering::SeqCst),
            bytes_down: i.bytes[1].load(Ordering::SeqCst),
        }
    }

    /// How many connections have carried at least `min_bytes` from the server so far.
    pub fn connections_that_carried(&self, min_bytes: u64) -> usize {
        self.connections_that_moved(1, min_bytes)
    }

    /// How many connections have carried at least `min_bytes` to the server so far.
    pub fn connections_that_sent(&self, min_bytes: u64) -> usize {
        self.connections_that_moved(0, min_bytes)
    }

    fn connections_that_moved(&self, way: usize, min_bytes: u64) -> usize {
        let counts = self.inner.by_connection.lock().unwrap();
        counts
            .iter()
            .filter(|c| c[way].load(Ordering::SeqCst) >= min_bytes)
            .count()
    }

    /// Forgets what connections carried so far (`connections_that_carried` and
    /// `connections_that_sent` count anew).
    pub fn reset_carried(&self) {
        for counts in self.inner.by_connection.lock().unwrap().iter() {
            counts.iter().for_each(|c| c.store(0, Ordering::SeqCst));
        }
    }

    /// Holds every answer from now on until `open` connections have been open at once
    /// (counted as [`Traffic::most_open`]), or until `at_most` has passed; then answers
    /// flow as before.
    pub fn hold_answers_until_open(&self, open: u64, at_most: Duration) {
        *self.inner.gate.lock().unwrap() = Some((open, Instant::now() + at_most));
    }

    /// Starts counting the most connections open at once from those open now.
    pub fn reset_most_open(&self) {
        let open = self.inner.open.load(Ordering::SeqCst);
        self.inner.most_open.store(open, Ordering::SeqCst);
    }
}

impl Drop for Shaper {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn serve(
    listener: std::net::TcpListener,
    inner: Arc<Inner>,
    mut stopped: watch::Receiver<bool>,
) {
    let listener = TcpListener::from_std(listener).expect("shaper listener");
    loop {
        let client = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => client,
                // Out of descriptors, say: try again shortly rather than spin.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            _ = stopped.changed() => return,
        };
        inner.accepted.fetch_add(1, Ordering::SeqCst);
        let open = inner.open.fetch_add(1, Ordering::SeqCst) + 1;
        inner.most_open.fetch_max(open, Ordering::SeqCst);
        inner.accepted_one.notify_waiters();
        let moved = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        inner
            .by_connection
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(moved.clone());
        let inner = inner.clone();
        tokio::spawn(async move {
            if let Ok(server) = TcpStream::connect(inner.upstream).await {
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                // The handshake's round trip: the first bytes up wait one more round trip.
                let handshake = inner.link.round_trip;
                let [up, down] = &*moved;
                tokio::join!(
                    direction(&inner, 0, client_read, server_write, handshake, up),
                    direction(&inner, 1, server_read, client_write, Duration::ZERO, down),
                );
            }
            inner.open.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

/// Bytes in flight on one direction of a connection at most (the link's buffer): a reader
/// this far ahead waits, and the sender's TCP window closes as on a real link.
const IN_FLIGHT_CHUNKS: usize = 64;
const CHUNK: usize = 64 << 10;

/// One direction of a connection (`way` 0: up, client to server; 1: down): a reader stamps
/// each chunk with its arrival, a writer lets it out half a round trip later, paced.
async fn direction(
    inner: &Inner,
    way: usize,
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    first_extra: Duration,
    carried: &AtomicU64,
) {
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(IN_FLIGHT_CHUNKS);
    let read = async move {
        loop {
            let mut chunk = vec![0u8; CHUNK];
            match from.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    chunk.truncate(n);
                    if tx.send((Instant::now(), chunk)).await.is_err() {
                        return;
                    }
                }
            }
        }
    };
    // Owns the receiver: a writer that stops drops it, and the reader then stops too.
    let write = async move {
        let one_way = inner.link.round_trip / 2;
        let mut extra = first_extra;
        let mut own = inner.link.per_connection.map(Pacer::new);
        while let Some((arrived, chunk)) = rx.recv().await {
            let mut leaves = arrived + one_way + std::mem::take(&mut extra);
            if let Some(own) = &mut own {
                leaves = own.book(leaves, chunk.len());
            }
            if let Some(total) = &inner.total {
                leaves = total[way]
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .book(leaves, chunk.len());
            }
            tokio::time::sleep_until(leaves).await;
            if way == 1 {
                inner.through_gate().await;
            }
            // Counted before they are written: a client that has read them all finds them
            // counted.
            inner.bytes[way].fetch_add(chunk.len() as u64, Ordering::SeqCst);
            carried.fetch_add(chunk.len() as u64, Ordering::SeqCst);
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        // The other side finished sending: pass its end on, after its last bytes.
        let _ = to.shutdown().await;
    };
    tokio::join!(read, write);
}
