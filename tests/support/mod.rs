//! Shared helpers of the integration tests: real S3 servers (s3s-fs, moto_server plain
//! and TLS, and Ceph RGW) on free loopback ports, a host pool, keys, and result collection.
//! One room per concern, every name re-exported here (`support::Server`, `support::keys`):
//!
//! - `tools`: where the binaries and scripts are (a missing one fails the test with a
//!   message naming the install script; it is never a silent skip);
//! - `process`: free ports, children that die with the test process, shared servers;
//! - `servers`: the S3 servers, killed when their handle drops, and also when the test
//!   process dies (PR_SET_PDEATHSIG), so no run leaves one behind;
//! - `tls`: a private CA and its certificates; `http`: requests the tests send themselves;
//! - `config`, `data`, `jobs`, `out_of_band`: tier configurations, pools and keys, waiting
//!   for results, and a store client of the test's own;
//! - `front`: the fault-injecting `proxy` in front of a server; `emulators` (Azure Blob and
//!   GCS), `shaper` (a remote link's latency) and `tls_relay` (TLS in front of a server);
//! - `cli` (not re-exported, its names are common ones): the `kvtier` command line run as
//!   a process; `c_tier` (not re-exported): a tier driven through the exported C functions.

#![allow(dead_code)]

pub mod c_tier;
pub mod cli;
pub mod emulators;
pub mod proxy;
pub mod shaper;
pub mod tls_relay;

mod config;
mod data;
mod front;
mod http;
mod jobs;
mod out_of_band;
mod process;
mod servers;
mod tls;
mod tools;

// Every test target uses a part of these, and is warned of none it leaves unused.
#[allow(unused_imports)]
pub use self::{
    config::*,
    data::*,
    front::*,
    http::{http_plain, https_request, signed_plain, signed_request},
    jobs::*,
    out_of_band::*,
    process::free_port,
    servers::*,
    tls::*,
    tools::*,
};

/// Defines each named test body (`fn(&Server)`) as three tests: one on a fresh s3s-fs,
/// one on the test binary's shared moto_server, one on its shared Ceph RGW. A body may be
/// named by the module that holds it (`faults::name`); the tests are named without it.
#[allow(unused_macros)]
macro_rules! on_both_servers {
    ($($name:ident),* $(,)?) => {
        mod s3s_fs {
            $( #[test] fn $name() { let server = super::Server::s3s_fs(); super::$name(&server); } )*
        }
        mod moto {
            $( #[test] fn $name() { super::$name(super::Server::shared_moto()); } )*
        }
        mod rgw {
            $( #[test] fn $name() { super::$name(super::Server::shared_rgw()); } )*
        }
    };
    ($($room:ident :: $name:ident),* $(,)?) => {
        mod s3s_fs {
            $( #[test] fn $name() { let server = super::Server::s3s_fs(); super::$room::$name(&server); } )*
        }
        mod moto {
            $( #[test] fn $name() { super::$room::$name(super::Server::shared_moto()); } )*
        }
        mod rgw {
            $( #[test] fn $name() { super::$room::$name(super::Server::shared_rgw()); } )*
        }
    };
}

/// Declares each named function of module `$room` (one file of a test target split by
/// idea) as a test of the module this is written in, under its own name: the test's name
/// does not carry the file that holds its body.
#[allow(unused_macros)]
macro_rules! tests_in {
    ($room:ident: $($name:ident),* $(,)?) => {
        $( #[test] fn $name() { $room::$name(); } )*
    };
}
