//! Processes the tests start: free loopback ports, children killed with the test process
//! (PR_SET_PDEATHSIG), shared servers started from a thread that never exits, and whether a
//! child really holds the port it was given.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How long a server may take to start on a loaded 2-core machine.
pub(super) const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// A port nobody listens on right now (the OS picks it).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Spawns `cmd` (standard input closed) so that it is killed when the thread that spawned
/// it ends (with the test process, for a thread that never exits).
pub(super) fn spawn_killed_with_parent(cmd: &mut Command) -> std::io::Result<Child> {
    // SAFETY: prctl is async-signal-safe; the closure allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    cmd.stdin(Stdio::null()).spawn()
}

/// Runs `start` on a thread named `name` that never exits and leaks what it returns: one
/// server per test process, shared by its tests. PR_SET_PDEATHSIG (given by the thread that
/// spawned the server) then fires only when the test process dies.
pub(super) fn leak_from_parked_thread<T: Sync + 'static>(
    name: &str,
    start: impl FnOnce() -> T + Send + 'static,
) -> &'static T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let shared: &'static T = Box::leak(Box::new(start()));
            tx.send(shared).unwrap();
            loop {
                std::thread::park();
            }
        })
        .unwrap();
    rx.recv()
        .unwrap_or_else(|_| panic!("{name} failed to start (see the panic above)"))
}

/// Whether process `pid` or one of its descendants (radosgw under its supervising script)
/// holds the socket listening on loopback port `port`, from /proc.
pub(super) fn holds_listener(pid: u32, port: u16) -> bool {
    let listening: std::collections::HashSet<String> = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .flat_map(|text| {
            text.lines()
                .skip(1)
                .filter_map(|row| {
                    let fields: Vec<&str> = row.split_whitespace().collect();
                    let local_port = fields.get(1)?.rsplit(':').next()?;
                    let listens = fields.get(3) == Some(&"0A")
                        && u16::from_str_radix(local_port, 16) == Ok(port);
                    listens.then(|| fields.get(9).map(|inode| inode.to_string()))?
                })
                .collect::<Vec<_>>()
        })
        .collect();
    // Every process with its parent, to find `pid`'s descendants.
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let child: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).ok()?;
            // The fields after the command name (which may hold spaces): state, parent.
            let parent = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            Some((child, parent))
        })
        .collect();
    let mut family = vec![pid];
    let mut next = 0;
    while next < family.len() {
        let parent = family[next];
        family.extend(parents.iter().filter(|p| p.1 == parent).map(|p| p.0));
        next += 1;
    }
    family.iter().any(|member| {
        std::fs::read_dir(format!("/proc/{member}/fd"))
            .into_iter()
            .flatten()
            .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
            .filter_map(|target| {
                let target = target.to_str()?;
                Some(
                    target
                        .strip_prefix("socket:[")?
                        .strip_suffix(']')?
                        .to_string(),
                )
            })
            .any(|inode| listening.contains(&inode))
    })
}
